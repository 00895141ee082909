"""Tool-call formats (``roll.tool_parser``): each round-trips, reads hand-written turns, rejects malformed ones with
a message the model sees, is listed and validated by name, and drives an env manager's episode when picked in YAML.

Golden texts are written by hand from each format's chat template (Qwen2.5 for hermes, Qwen3-Coder, Llama 3.1,
Mistral v3), not produced by the code under test.
"""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.envs.learnable import GuessDirectionConfig, GuessDirectionEnv
from roll.agentic.tool_parsers import get_tool_parser, tool_parser_names
from roll.agentic.tools.calculator import CalculatorTool
from roll.agentic.tools.wrapper import ToolEnvWrapper, ToolWrapperConfig
from roll.agentic.types import ToolCall, ToolCallError, ToolParser, ToolResponse, tool_schema
from roll.core.errors import ConfigError, PluginError

FORMATS = ["hermes", "qwen3_coder", "llama3_json", "mistral"]

# A tool whose schema declares every JSON type (qwen3_coder types its raw-text values by it).
PROBE = {
    "type": "function",
    "function": {
        "name": "probe",
        "description": "takes one argument of each type",
        "parameters": {
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "count": {"type": "integer"},
                "ratio": {"type": "number"},
                "flag": {"type": "boolean"},
                "items": {"type": "array"},
                "options": {"type": "object"},
                "nothing": {"type": "integer"},
            },
            "required": ["text"],
        },
    },
}
CALC = tool_schema(CalculatorTool())
TOOLS = [PROBE, CALC]

# ---------------------------------------------------------------- round trips

TRICKY = [
    'say "hi"',
    "line one\nline two",
    "\nleading and trailing newlines\n",
    "naïve café ☕ 数学 🚀",
    "back\\slash and \\n (not a newline)",
    '{"looks": ["like", "json"]}',
    "42",
    "true",
    "",
    "<tool_call> inside a value",
    "a <parameter=x> tag without its end",
    "semi; colon [TOOL_CALLS] <|python_tag|>",
    '<|python_tag|>{"name": 1}',
    "[TOOL_CALLS][] at the start",
]
NOT_QWEN3_CODER = ["a </tool_call> in a value", "</parameter></function>", "<\\/ already escaped"]
"""Values the qwen3_coder format cannot carry (its raw text would end the block); the JSON formats can."""


def _random_text(rng: random.Random, fmt: str) -> str:
    alphabet = string.ascii_letters + string.digits + " \"'\\\n\t{}[];:,<>=/éß数🚀"
    tricky = TRICKY + (NOT_QWEN3_CODER if fmt != "qwen3_coder" else [])
    return rng.choice(tricky) if rng.random() < 0.5 else "".join(rng.choices(alphabet, k=rng.randint(0, 30)))


def _random_arguments(rng: random.Random, fmt: str) -> dict[str, Any]:
    args: dict[str, Any] = {"text": _random_text(rng, fmt)}
    makers = {
        "count": lambda: rng.randint(-(10**12), 10**12),
        "ratio": lambda: rng.choice([0.5, -1e-7, 3.25e10, rng.uniform(-100, 100)]),
        "flag": lambda: rng.random() < 0.5,
        "items": lambda: [rng.randint(0, 9), _random_text(rng, fmt), None, [True, 1.5]],
        "options": lambda: {"k": _random_text(rng, fmt), "nested": {"n": rng.randint(0, 5)}, "e": []},
        "nothing": lambda: None,
    }
    for key, make in makers.items():
        if rng.random() < 0.6:
            args[key] = make()
    return args


def _random_calls(rng: random.Random, fmt: str) -> list[ToolCall]:
    calls = []
    for _ in range(rng.randint(1, 3)):
        call_id = (
            "".join(rng.choices(string.ascii_letters + string.digits, k=9)) if fmt == "mistral" else None
        )
        if rng.random() < 0.3:
            calls.append(ToolCall("calculator", {"expression": "(3 + 5) * 2"}, call_id))
        else:
            calls.append(ToolCall("probe", _random_arguments(rng, fmt), call_id))
    return calls


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_round_trips_calls_of_every_argument_type(fmt: str) -> None:
    """200 seeded random turns of 1-3 calls per format: strings with quotes, newlines, backslashes, unicode and
    JSON-looking text, large integers, floats, booleans, null, nested arrays and objects; ``parse(render(calls))``
    gives the same calls (ids included for mistral) and no error."""
    parser = get_tool_parser(fmt, TOOLS)
    rng = random.Random(f"round-trip-{fmt}")
    for _ in range(200):
        calls = _random_calls(rng, fmt)
        text = parser.render(calls)
        parsed = parser.parse(text)
        assert parsed.errors == [] and parsed.calls == calls, text
        assert parsed.checked() == calls and parsed.content == ""


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendered_calls_after_text_keep_the_text_as_content(fmt: str) -> None:
    parser = get_tool_parser(fmt, TOOLS)
    calls = [ToolCall("calculator", {"expression": "7*6"}, "abcDEF123" if fmt == "mistral" else None)]
    # Llama's template writes the JSON alone; text before a call needs the <|python_tag|> that starts it
    sep = "<|python_tag|>" if fmt == "llama3_json" else "\n"
    parsed = parser.parse("Let me compute. " + sep + parser.render(calls))
    assert parsed.calls == calls and parsed.content == "Let me compute."


def test_renders_match_the_templates() -> None:
    """Each format writes an assistant turn exactly as its template does (Qwen2.5, Qwen3-Coder, Llama 3.1,
    Mistral v3 with ids), for two calls where the format allows more than one."""
    add = ToolCall("calculator", {"expression": "1+1"}, "a1B2c3D4e")
    two = [add, ToolCall("probe", {"text": 'é\n"q"', "count": 3}, "zzzzzzzz9")]
    hermes = get_tool_parser("hermes", TOOLS).render(two)
    assert hermes == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "probe", "arguments": {"text": "é\\n\\"q\\"", "count": 3}}\n</tool_call>'
    )
    coder = get_tool_parser("qwen3_coder", TOOLS).render(two)
    assert coder == (
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n</parameter>\n</function>\n</tool_call>\n"
        '<tool_call>\n<function=probe>\n<parameter=text>\né\n"q"\n</parameter>\n<parameter=count>\n3\n</parameter>\n'
        "</function>\n</tool_call>"
    )
    llama = get_tool_parser("llama3_json", TOOLS).render([add])
    assert llama == '{"name": "calculator", "parameters": {"expression": "1+1"}}'
    mistral = get_tool_parser("mistral", TOOLS).render(two)
    assert mistral == (
        '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "1+1"}, "id": "a1B2c3D4e"}, '
        '{"name": "probe", "arguments": {"text": "é\\n\\"q\\"", "count": 3}, "id": "zzzzzzzz9"}]'
    )


def test_qwen3_coder_refuses_values_it_cannot_carry() -> None:
    parser = get_tool_parser("qwen3_coder", TOOLS)
    with pytest.raises(ToolCallError, match="cannot carry"):
        parser.render([ToolCall("probe", {"text": "a </parameter> b"})])


# ---------------------------------------------------------------- golden parses

GOLDEN = [
    (
        "hermes",
        'I will add.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>\n'
        '<tool_call>{"name": "probe", "arguments": "{\\"text\\": \\"s\\"}"}</tool_call>',
        "I will add.",
        [ToolCall("calculator", {"expression": "2+2"}), ToolCall("probe", {"text": "s"})],
    ),
    (
        "qwen3_coder",
        "Thinking first.\n<tool_call>\n<function=probe>\n<parameter=text>\n  two\nlines  \n</parameter>\n"
        "<parameter=count>\n-7\n</parameter>\n<parameter=ratio>\n2.5\n</parameter>\n<parameter=flag>\nTrue\n"
        '</parameter>\n<parameter=items>\n[1, "a"]\n</parameter>\n<parameter=options>\n{"k": null}\n'
        "</parameter>\n<parameter=nothing>\nnull\n</parameter>\n</function>\n</tool_call>",
        "Thinking first.",
        [
            ToolCall(
                "probe",
                {
                    "text": "  two\nlines  ",
                    "count": -7,
                    "ratio": 2.5,
                    "flag": True,
                    "items": [1, "a"],
                    "options": {"k": None},
                    "nothing": None,
                },
            )
        ],
    ),
    (
        "qwen3_coder",  # the count is typed by the schema: 12 the integer, "12" the text
        "<tool_call>\n<function=probe>\n<parameter=text>\n12\n</parameter>\n<parameter=count>\n12\n</parameter>\n"
        "</function>\n</tool_call>",
        "",
        [ToolCall("probe", {"text": "12", "count": 12})],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "calculator", "parameters": {"expression": "3*7"}}',
        "",
        [ToolCall("calculator", {"expression": "3*7"})],
    ),
    (
        "llama3_json",
        ' {"name": "calculator", "arguments": {"expression": "1"}}; {"name": "probe", "parameters": {"text": "x"}}',
        "",
        [ToolCall("calculator", {"expression": "1"}), ToolCall("probe", {"text": "x"})],
    ),
    (
        "mistral",
        'Sure. [TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "9-1"}, "id": "Xy7Zq1w2E"}]</s>',
        "Sure.",
        [ToolCall("calculator", {"expression": "9-1"}, "Xy7Zq1w2E")],
    ),
    (
        "mistral",  # an older template: no ids
        '[TOOL_CALLS][{"name": "probe", "arguments": {"text": "a"}}, {"name": "probe", "arguments": {}}]',
        "",
        [ToolCall("probe", {"text": "a"}), ToolCall("probe", {})],
    ),
    (
        "mistral",  # the v11 form, with and without a call id
        'On it.[TOOL_CALLS]calculator[ARGS]{"expression": "2*3"}[TOOL_CALLS]probe[CALL_ID]k9Xw2mQ7a[ARGS]{"text": "]"}',
        "On it.",
        [ToolCall("calculator", {"expression": "2*3"}), ToolCall("probe", {"text": "]"}, "k9Xw2mQ7a")],
    ),
]


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"), GOLDEN, ids=[f"{g[0]}-{i}" for i, g in enumerate(GOLDEN)]
)
def test_golden_parses_of_hand_written_turns(
    fmt: str, text: str, content: str, calls: list[ToolCall]
) -> None:
    parsed = get_tool_parser(fmt, TOOLS).parse(text)
    assert parsed.errors == [] and parsed.calls == calls and parsed.content == content


@pytest.mark.parametrize("fmt", FORMATS)
def test_plain_answers_are_not_calls(fmt: str) -> None:
    for text in ["<answer>Left</answer>", "The result is 42.", ""]:
        parsed = get_tool_parser(fmt, TOOLS).parse(text)
        assert parsed.items == () and parsed.content == text


# ---------------------------------------------------------------- malformed calls

MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "calculator", "arguments": {"expr', "unclosed <tool_call> tag"),
    (
        "hermes",
        '<tool_call>{"name": "calculator", "arguments": {"expression": 1+1}}</tool_call>',
        "not valid JSON",
    ),
    (
        "hermes",
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        "unknown tool 'rm_rf'; available: ",
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+",
        "unclosed <tool_call> tag",
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n</function>\n</tool_call>",
        "closed <parameter=ARG>",
    ),
    (
        "qwen3_coder",
        '<tool_call>\n{"name": "calculator", "arguments": {}}\n</tool_call>',
        "needs one <function=NAME>",
    ),
    ("qwen3_coder", "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>", "unknown tool 'rm_rf'"),
    (
        "qwen3_coder",
        "<tool_call>\n<function=probe>\n<parameter=count>\nmany\n</parameter>\n</function>\n</tool_call>",
        "parameter 'count' must be integer, got 'many'",
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=probe>\n<parameter=text>\na\n</parameter>\n<parameter=text>\nb\n</parameter>\n</function>\n</tool_call>",
        "given twice",
    ),
    ("llama3_json", '{"name": "calculator", "parameters": {"expression": "1+', "not valid JSON"),
    (
        "llama3_json",
        '<|python_tag|>{"name": "probe", "parameters": {"text": "1"}} thanks!',
        "unexpected text after the tool call",
    ),
    ("llama3_json", '{"name": "rm_rf", "parameters": {}}', "unknown tool 'rm_rf'"),
    ("llama3_json", '{"function": "calculator"}', 'must be a JSON object {"name": ..., "parameters": {...}}'),
    ("mistral", '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "1"', "not valid JSON"),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "calculator", "arguments": [1]}]',
        "'arguments' must be a JSON object",
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}, "id": "abcdefghi"}]',
        "unknown tool 'rm_rf'",
    ),
    ("mistral", '[TOOL_CALLS][{"name": "calculator", "arguments": {}, "id": 7}]', "'id' must be a string"),
    ("mistral", "[TOOL_CALLS][]", "list is empty"),
    (
        "mistral",
        '[TOOL_CALLS]calculator[ARGS]{"expression": ',
        "the [ARGS] of 'calculator' are not valid JSON",
    ),
]


@pytest.mark.parametrize(
    ("fmt", "text", "message"), MALFORMED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MALFORMED)]
)
def test_malformed_calls_are_errors_the_env_answers(fmt: str, text: str, message: str) -> None:
    """The parser returns a ToolCallError (never raises) and ``checked`` raises it; through the env wrapper the
    model reads ``format error: <message>`` as the tool's answer, the turn is marked format_ok False, carries the
    penalty, calls no tool and does not end the episode."""
    parsed = get_tool_parser(fmt, TOOLS).parse(text)
    assert parsed.errors and message in str(parsed.errors[0])
    with pytest.raises(ToolCallError) as raised:
        parsed.checked()
    assert raised.value is parsed.errors[0]
    calculator = Counting()
    env = ToolEnvWrapper(
        GuessDirectionEnv(GuessDirectionConfig(max_steps=1)),
        [calculator, Named("probe")],
        ToolWrapperConfig(format=fmt, format_error_reward=-0.5),
    )
    env.reset(seed=0)
    out = env.step(text)
    assert "format error: " in str(out.observation) and message in str(out.observation), out.observation
    assert out.info["format_ok"] is False and out.reward == pytest.approx(-0.5) and not out.done
    assert calculator.calls == 0


class Counting(CalculatorTool):
    """The calculator, counting the calls that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def call(self, arguments: dict[str, Any]) -> Any:
        self.calls += 1
        return super().call(arguments)


class Named(CalculatorTool):
    """A calculator under another name and schema: the tool that :data:`PROBE` describes."""

    parameters = PROBE["function"]["parameters"]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


# ---------------------------------------------------------------- the wrapper, per format


@pytest.mark.parametrize("fmt", FORMATS)
def test_wrapper_runs_a_rendered_call_in_every_format(fmt: str) -> None:
    """The system prompt is the format's (tools listed, the call limit stated); a call written by the format's
    ``render`` reaches the calculator (6*7 -> 42) and the answer comes back in the format's result markup."""
    calculator = Counting()
    env = ToolEnvWrapper(GuessDirectionEnv(), [calculator], ToolWrapperConfig(format=fmt, max_tool_calls=3))
    env.reset(seed=0)
    marker = {
        "hermes": "<tool_call>",
        "qwen3_coder": "<function=",
        "llama3_json": '"parameters"',
        "mistral": "[AVAILABLE_TOOLS]",
    }
    assert marker[fmt] in env.system_prompt and "calculator" in env.system_prompt
    assert "at most 3 calls per episode" in env.system_prompt
    call = ToolCall("calculator", {"expression": "6*7"}, "abcdefghi" if fmt == "mistral" else None)
    out = env.step(env.parser.render([call]))
    assert calculator.calls == 1 and out.info == {"tool_calls": 1, "tool_calls_ok": 1, "format_ok": True}
    answer = env.parser.render_responses([ToolResponse("42", "calculator", call.id)])
    assert out.observation == answer
    assert {
        "hermes": "<tool_response>\n42\n</tool_response>",
        "qwen3_coder": "<tool_response>\n42\n</tool_response>",
        "llama3_json": "42",
        "mistral": '[TOOL_RESULTS] {"content": "42", "call_id": "abcdefghi"}[/TOOL_RESULTS]',
    }[fmt] == answer


def test_the_default_format_is_hermes_with_its_prompt() -> None:
    """Without ``format`` the wrapper is what it was: hermes, the Qwen tools prompt word for word."""
    env = ToolEnvWrapper(GuessDirectionEnv(), [CalculatorTool()], ToolWrapperConfig(max_tool_calls=2))
    assert env.parser.name == "hermes"
    schema = '{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic'
    tail = (
        "# Tools\n\nYou may call one or more functions to assist with the task. You can make at most 2 calls per "
        f"episode.\nFunction signatures are within <tools></tools> XML tags:\n<tools>\n{schema}"
    )
    assert tail in env.system_prompt
    assert env.system_prompt.endswith(
        'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call>"
    )


def test_each_tools_prompt_is_the_templates() -> None:
    """Spot checks of each format's tools section against its template: Qwen3-Coder's XML listing, Llama 3.1's
    system-prompt instructions with indented JSON, Mistral's [AVAILABLE_TOOLS] list."""
    coder = get_tool_parser("qwen3_coder", [CALC]).tools_prompt()
    assert coder.startswith(
        "# Tools\n\nYou have access to the following functions:\n\n<tools>\n<function>\n<name>calculator</name>\n"
        "<description>Evaluate an arithmetic expression"
    )
    assert (
        "<parameter>\n<name>expression</name>\n<type>string</type>\n<description>e.g. (3 + 5) * 2</description>\n"
        '</parameter>\n<required>["expression"]</required>\n</parameters>\n</function>\n</tools>'
    ) in coder
    assert "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format" in coder
    llama = get_tool_parser("llama3_json", [CALC]).tools_prompt()
    assert llama.startswith(
        "You have access to the following functions. To call a function, please respond with JSON for a function "
        'call.Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
        'value}.Do not use variables.\n\n{\n    "type": "function",\n    "function": {\n        "name": "calculator"'
    )
    mistral = get_tool_parser("mistral", [CALC]).tools_prompt()
    assert mistral.startswith('[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "calculator"')
    assert mistral.endswith("}}][/AVAILABLE_TOOLS]")


# ---------------------------------------------------------------- registry and config


def test_formats_are_plugins_listed_and_checked_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert tool_parser_names() == ["hermes", "llama3_json", "mistral", "qwen3_coder"]
    for name in FORMATS:
        parser = get_tool_parser(name)
        assert isinstance(parser, ToolParser) and parser.name == name
    with pytest.raises(PluginError, match="installed: hermes, llama3_json, mistral, qwen3_coder"):
        get_tool_parser("qwen3")
    from roll.core.cli import _cmd_list

    _cmd_list(None)  # type: ignore[arg-type]  # `roll list`: takes no arguments
    listed = capsys.readouterr().out.split("roll.tool_parser:", 1)[1]
    for name in FORMATS:
        assert any(
            line.split()[:2] == [name, "roll-agentic"] and line.endswith(" ok")
            for line in listed.splitlines()
        )


def test_format_key_is_validated_against_the_registry_with_its_key_path(tmp_path: Path) -> None:
    """A misspelled format is a config error at ``env_manager.envs.0.tool_calls.format`` listing the installed
    formats, for an env entry's tools and for countdown's own calculator wrapper alike."""
    from roll.core.cli import load_run_config

    base = Path(__file__).resolve().parents[2] / "examples" / "agentic_guess.yaml"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        f"defaults: [{base}]\nenv_manager:\n  envs:\n    - type: guess_direction\n"
        "      tools: [{type: calculator}]\n      tool_calls: {format: qwen3-coder}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_run_config(cfg, [])
    [issue] = [i for i in err.value.issues if "format" in i.path]
    assert issue.path == "env_manager.envs.0.tool_calls.format"
    assert (
        "no roll.tool_parser plugin named 'qwen3-coder'; installed: hermes, llama3_json, mistral, qwen3_coder"
        in issue.message
    )
    from roll.agentic.env_manager.check import env_issues
    from roll.agentic.env_manager.config import EnvEntryConfig

    countdown = EnvEntryConfig(type="countdown", options={"tools": {"format": "llama3"}})
    [bad] = env_issues([countdown])
    assert bad.path == "env_manager.envs.0.options.tools.format" and "installed: hermes" in bad.message


# ---------------------------------------------------------------- an agentic run with a non-Hermes format

RUN_YAML = """\
defaults: [{base}]
env_manager:
  mode: trajectory
  envs:
    - type: guess_direction
      options: {{num_directions: 2, max_steps: 1}}
      tools: [{{type: calculator}}]
      tool_calls: {{format: qwen3_coder, max_tool_calls: 1, tool_success_reward: 0.25}}
rollout:
  max_new_tokens: 64
"""


def test_an_agentic_rollout_reaches_the_calculator_through_qwen3_coder(tmp_path: Path) -> None:
    """An agentic config selects ``qwen3_coder`` in YAML; the env manager runs a group of 2 episodes of the
    guess_direction env built from it (the env workers' own factory), with the tiny tokenizer's chat template and
    a scripted policy (a random tiny model emits no valid call): turn 1 is a Qwen3-Coder call of the calculator,
    turn 2 the answer. The calculator is reached (its 42 is in each trajectory, masked as an observation), the turn
    earns the tool reward, and the prompt shows the tools in the Qwen3-Coder listing. The same turn in Hermes's
    JSON is a format error under this format."""
    from roll.agentic.env_manager.chat import ChatEncoder
    from roll.agentic.env_manager.manager import Generation, RolloutManager
    from roll.agentic.env_manager.slots import EnvSlots, factory_for
    from roll.core.cli import load_run_config
    from roll.data.tokenizer import build_tokenizer

    base = Path(__file__).resolve().parents[2] / "examples" / "agentic_guess.yaml"
    cfg_path = tmp_path / "qwen3_coder.yaml"
    cfg_path.write_text(RUN_YAML.format(base=base))
    _, config = load_run_config(cfg_path, [])
    manager_cfg = config.env_manager
    assert manager_cfg.envs[0].tool_calls.format == "qwen3_coder"
    encoder = ChatEncoder(build_tokenizer("roll-tiny"))
    call = "<tool_call>\n<function=calculator>\n<parameter=expression>\n6*7\n</parameter>\n</function>\n</tool_call>"

    def rollout(first_turn: str) -> Any:
        answers = iter([first_turn, "<answer>Left</answer>"])

        def policy(prompts: list[list[int]], *, seed: int) -> list[Generation]:
            ids = [*encoder.encode(next(answers)), encoder.eos_token_id]
            return [Generation(list(ids), [-0.5] * len(ids)) for _ in prompts]

        pool = EnvSlots(2, factory_for(manager_cfg.envs), timeout_s=30.0)
        try:
            return RolloutManager(manager_cfg, pool, policy, encoder, max_new_tokens=32).rollout(
                1, 2, batch_seed=0
            )
        finally:
            pool.close()

    result = rollout(call)
    assert len(result.episodes) == 2
    for episode in result.episodes:
        first = episode.turns[0]
        assert first.info == {"tool_calls": 1, "tool_calls_ok": 1, "format_ok": True}
        assert first.reward == pytest.approx(0.25)
        assert "<function>\n<name>calculator</name>" in episode.system
    [sample, _] = result.samples("trajectory")
    text = encoder.tokenizer.decode(sample.input_ids)
    assert "<tool_response>\n42\n</tool_response>" in text
    observed = encoder.encode("<tool_response>\n42\n</tool_response>")
    start = next(
        i for i in range(len(sample.input_ids)) if sample.input_ids[i : i + len(observed)] == observed
    )
    assert sample.loss_mask[start : start + len(observed)] == [0] * len(observed)

    hermes = rollout('<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>')
    turn = hermes.episodes[0].turns[0]
    assert turn.info["format_ok"] is False and turn.info["tool_calls_ok"] == 0


def test_a_format_plugin_that_raises_fails_the_step_naming_the_plugin() -> None:
    """Bad model output is a ToolCallError item; an exception from ``parse`` is the plugin's bug: the env step
    fails (an env error, traceback shown once) with a note naming the format and the text it was parsing."""

    class Broken:
        name = "broken"

        def parse(self, text: str) -> Any:
            raise KeyError("oops")

    env = ToolEnvWrapper(GuessDirectionEnv(), [CalculatorTool()])
    env.parser = Broken()  # type: ignore[assignment]
    env.reset(seed=0)
    with pytest.raises(KeyError) as raised:
        env.step("Left")
    assert "in roll.tool_parser 'broken', parsing 'Left'" in (raised.value.__notes__ or [])
