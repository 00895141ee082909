"""The config loader: composition, interpolation, overrides, source locations and the public API."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from roll.core.config import ConfigTree, RunConfig, dump_yaml, load_config, load_tree
from roll.core.errors import ConfigError


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def error_of(path: Path, overrides: tuple[str, ...] = ()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_tree(path, overrides)
    return info.value


# --- composition -----------------------------------------------------------------------------------------


def test_defaults_merge_paths_groups_and_self_last(tmp_path: Path) -> None:
    write(tmp_path, "common/ray.yaml", "ray: {namespace: shared, num_cpus: 2}\n")
    write(tmp_path, "conf/base.yaml", "seed: 1\nmax_steps: 5\ntags: [a, b]\n")
    write(tmp_path, "conf/model/tiny.yaml", "hidden: 64\nlayers: 2\n")
    main = write(
        tmp_path,
        "conf/main.yaml",
        """
        defaults:
          - base.yaml
          - ../common/ray
          - model: tiny
        seed: 7
        tags: [c]
        ray: {num_cpus: 4}
        model: {layers: 3}
        """,
    )
    tree = load_tree(main)
    assert tree.data == {
        "seed": 7,
        "max_steps": 5,
        "tags": ["c"],  # lists are replaced, not concatenated
        "ray": {"namespace": "shared", "num_cpus": 4},  # mappings merge deeply
        "model": {"hidden": 64, "layers": 3},
    }
    assert "defaults" not in tree.data


def test_self_first_lets_includes_override_the_file(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", "seed: 1\n")
    main = write(tmp_path, "main.yaml", "defaults: [_self_, base.yaml]\nseed: 7\nname: x\n")
    assert load_tree(main).data == {"seed": 1, "name": "x"}


def test_nested_defaults_are_relative_to_their_file_and_package(tmp_path: Path) -> None:
    write(tmp_path, "model/parts/attn.yaml", "heads: 4\n")
    write(tmp_path, "model/small.yaml", "defaults:\n  - parts: attn\nhidden: 32\n")
    write(tmp_path, "sub/leaf.yaml", "leaf: true\n")
    write(tmp_path, "mid.yaml", "defaults: [sub/leaf.yaml]\nmid: 1\n")
    main = write(
        tmp_path,
        "main.yaml",
        "defaults:\n  - mid.yaml\n  - model: small\n  - model: null\n  - sub/leaf.yaml@extra.here\n",
    )
    tree = load_tree(main)
    assert tree.data == {
        "leaf": True,
        "mid": 1,
        "model": {"parts": {"heads": 4}, "hidden": 32},
        "extra": {"here": {"leaf": True}},
    }
    assert tree.sources["model.parts.heads"].endswith("attn.yaml:1")
    assert tree.sources["extra.here.leaf"].endswith("leaf.yaml:1")


def test_defaults_cycle_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # locations are shown relative to the working directory
    write(tmp_path, "a.yaml", "defaults: [b.yaml]\nx: 1\n")
    write(tmp_path, "b.yaml", "defaults: [c.yaml]\n")
    write(tmp_path, "c.yaml", "defaults: [a.yaml]\n")
    error = error_of(Path("a.yaml"))
    assert str(error) == (
        "1 problem in config:\n  - defaults (c.yaml:1): defaults cycle: a.yaml -> b.yaml -> c.yaml -> a.yaml"
    )


def test_missing_group_option_lists_the_options(tmp_path: Path) -> None:
    write(tmp_path, "model/tiny.yaml", "a: 1\n")
    write(tmp_path, "model/small.yaml", "a: 2\n")
    main = write(tmp_path, "main.yaml", "defaults:\n  - model: tin\n  - nothere.yaml\n  - 3\n")
    error = error_of(main)
    assert [issue.path for issue in error.issues] == ["defaults.0", "defaults.1", "defaults.2"]
    assert "included file not found" in error.issues[0].message
    assert error.issues[0].hint is not None and "small, tiny" in error.issues[0].hint
    assert error.issues[1].source is not None and error.issues[1].source.endswith("main.yaml:3")
    assert "a defaults entry must be" in error.issues[2].message


def test_file_errors(tmp_path: Path) -> None:
    assert "cannot read config file" in str(error_of(tmp_path / "absent.yaml"))
    bad = write(tmp_path, "bad.yaml", "a: 1\nb: [1, 2\nc: 3\n")
    syntax = error_of(bad).issues[0]
    assert syntax.source is not None and syntax.source.endswith("bad.yaml:3:2")
    assert syntax.message == (
        "YAML syntax error: expected ',' or ']', but got ':' (while parsing a flow sequence started at line 2)"
    )
    listed = write(tmp_path, "list.yaml", "- a\n- b\n")
    assert "top level must be a mapping" in str(error_of(listed))
    dup = write(tmp_path, "dup.yaml", "a: 1\nb: 2\na: 3\n")
    assert "duplicate key 'a' (first written on line 1)" in str(error_of(dup))
    assert load_tree(write(tmp_path, "empty.yaml", "")).data == {}


# --- source locations ------------------------------------------------------------------------------------


def test_sources_point_at_the_line_of_each_key(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", "ray:\n  namespace: base\n  num_cpus: 2\n")
    main = write(
        tmp_path, "main.yaml", "defaults: [base.yaml]\nray:\n  num_cpus: 4\nlist:\n  - 1\n  - x: 2\n"
    )
    tree = load_tree(main, ["ray.namespace=cli"])
    assert tree.sources["ray.num_cpus"].endswith("main.yaml:3")
    assert tree.sources["ray.namespace"] == "<override 1: ray.namespace=cli>"
    assert tree.sources["list.1.x"].endswith("main.yaml:6")
    assert tree.source("ray.absent") == tree.sources["ray"]
    assert tree.source("nothing.at.all") == tree.sources[""]


def test_floats_in_exponent_form_and_anchors(tmp_path: Path) -> None:
    main = write(tmp_path, "main.yaml", "lr: 1e-6\nbig: 3E5\nbase: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n")
    data = load_tree(main).data
    assert data["lr"] == pytest.approx(1e-6) and isinstance(data["lr"], float)
    assert data["big"] == 3e5
    assert data["other"] == {"x": 1, "y": 2}


# --- interpolation ---------------------------------------------------------------------------------------


def test_interpolation_keeps_types_and_formats_strings(tmp_path: Path) -> None:
    main = write(
        tmp_path,
        "main.yaml",
        """
        output_dir: /tmp/run
        n: 8
        flag: true
        sizes: [1, 2]
        model: {hidden: "${n}", copy: "${sizes}"}
        ckpt: "${output_dir}/ckpt-${n}-${flag}"
        whole: "${model}"
        item: "${sizes.1}"
        literal: "\\\\${n}"
        """,
    )
    data = load_tree(main).data
    assert data["model"] == {"hidden": 8, "copy": [1, 2]}
    assert data["ckpt"] == "/tmp/run/ckpt-8-true"
    assert data["whole"] == {"hidden": 8, "copy": [1, 2]}
    assert data["item"] == 2
    assert data["literal"] == "${n}"


def test_interpolation_sees_overrides(tmp_path: Path) -> None:
    main = write(tmp_path, "main.yaml", "output_dir: a\nckpt: ${output_dir}/ckpt\n")
    assert load_tree(main, ["output_dir=/x"]).data["ckpt"] == "/x/ckpt"
    assert load_tree(main, ["ckpt=${output_dir}/other"]).data["ckpt"] == "a/other"


def test_env_interpolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLL_TEST_HOME", "/home/x")
    monkeypatch.delenv("ROLL_TEST_UNSET", raising=False)
    main = write(
        tmp_path,
        "main.yaml",
        "a: ${env:ROLL_TEST_HOME}/runs\nb: ${env:ROLL_TEST_UNSET, fallback}\nc: ${oc.env:ROLL_TEST_HOME}\n",
    )
    assert load_tree(main).data == {"a": "/home/x/runs", "b": "fallback", "c": "/home/x"}


def test_interpolation_errors_are_all_reported_with_the_referring_key(tmp_path: Path) -> None:
    main = write(
        tmp_path,
        "main.yaml",
        """
        output_dir: out
        a: ${outptu_dir}/x
        b: ${env:ROLL_TEST_SURELY_UNSET}
        c: ${d}
        d: ${c}
        e: ${nope:x}
        f: "pre-${output_dir"
        g: {h: "${g}"}
        i: "x${g}"
        """,
    )
    error = error_of(main)
    by_path = {issue.path: issue for issue in error.issues}
    assert by_path["a"].message == "${outptu_dir} refers to a key that does not exist"
    assert by_path["a"].hint == "did you mean 'output_dir'?"
    assert by_path["a"].source is not None and by_path["a"].source.endswith("main.yaml:2")
    assert "environment variable 'ROLL_TEST_SURELY_UNSET' is not set" in by_path["b"].message
    assert by_path["d"].message == "interpolation cycle: c -> d -> c"
    assert "unknown resolver 'nope'" in by_path["e"].message
    assert "unterminated" in by_path["f"].message
    assert by_path["g.h"].message == "interpolation cycle: g -> g.h -> g"
    assert "cannot be part of a string" in by_path["i"].message


# --- overrides -------------------------------------------------------------------------------------------


def test_override_values_are_parsed_as_yaml(tmp_path: Path) -> None:
    main = write(
        tmp_path, "main.yaml", "a: {i: 0, f: 0.0, b: false, l: [], n: 1, s: x, e: y}\nlst: [1, 2, 3]\n"
    )
    tree = load_tree(
        main, ["a.i=8", "a.f=3e-4", "a.b=true", "a.l=[1, 2]", "a.n=null", "a.s='8'", "a.e=", "lst.1=9"]
    )
    assert tree.data["a"] == {"i": 8, "f": 3e-4, "b": True, "l": [1, 2], "n": None, "s": "8", "e": ""}
    assert tree.data["lst"] == [1, 9, 3]
    assert tree.sources["a.i"] == "<override 1: a.i=8>"


def test_add_force_and_delete(tmp_path: Path) -> None:
    main = write(tmp_path, "main.yaml", "a: {b: 1, c: 2}\n")
    tree = load_tree(main, ["+a.d=3", "+x.y.z={k: v}", "~a.c", "++a.b=5", "++a.e=6"])
    assert tree.data == {"a": {"b": 5, "d": 3, "e": 6}, "x": {"y": {"z": {"k": "v"}}}}
    assert tree.sources["x.y.z"] == "<override 2: +x.y.z={k: v}>"
    assert "a.c" not in tree.sources


def test_override_errors_are_all_reported(tmp_path: Path) -> None:
    main = write(tmp_path, "main.yaml", "trainer: {learning_rate: 1, epochs: 2}\nname: x\n")
    error = error_of(
        main,
        (
            "trainer.learning_rat=3",
            "+trainer.epochs=3",
            "~trainer.nope",
            "tranier.epochs=1",
            "name",
            "a..b=1",
        ),
    )
    rendered = [issue.render() for issue in error.issues]
    assert rendered[0] == (
        "trainer.learning_rat (<override 1: trainer.learning_rat=3>): no key 'trainer.learning_rat' to override"
        "\n    hint: did you mean 'trainer.learning_rate'? (to add a new key write +trainer.learning_rat=...)"
    )
    assert (
        "key already exists; `+` only adds new keys" in rendered[1]
        and "write trainer.epochs=3" in rendered[1]
    )
    assert "no key 'trainer.nope' to delete" in rendered[2]
    assert "no key 'tranier' to override" in rendered[3] and "did you mean 'trainer'?" in rendered[3]
    assert "expected key=value" in rendered[4]
    assert "malformed key 'a..b'" in rendered[5]
    assert str(error).startswith("6 problems in config:\n  - trainer.learning_rat")


def test_overrides_may_set_keys_the_model_declares(tmp_path: Path) -> None:
    main = write(tmp_path, "main.yaml", "pipeline: sft\n")
    config = load_config(main, ["seed=3", "tracking.log_every=5"])
    assert (config.seed, config.tracking.log_every) == (3, 5)
    with pytest.raises(ConfigError, match=r"did you mean 'seed'\?"):
        load_config(main, ["sed=3"])
    # a misspelt key in a section the model declares but the YAML leaves out: the key is named, not the section
    with pytest.raises(ConfigError) as caught:
        load_config(main, ["tracking.log_evry=5"])
    (issue,) = caught.value.issues
    assert issue.path == "tracking.log_evry" and (issue.hint or "").startswith(
        "did you mean 'tracking.log_every'"
    )
    with pytest.raises(ConfigError, match=r"no key 'trackng' to override"):
        load_config(main, ["trackng.log_every=5"])


# --- public API ------------------------------------------------------------------------------------------


def test_load_config_validates_freezes_and_dumps(tmp_path: Path) -> None:
    main = write(tmp_path, "main.yaml", "pipeline: sft\noutput_dir: ${env:ROLL_TEST_OUT,/tmp/out}\n")
    config = load_config(main, ["max_steps=3"])
    assert isinstance(config, RunConfig)
    assert config.output_dir == Path("/tmp/out") and config.max_steps == 3
    with pytest.raises(Exception, match="frozen"):
        config.seed = 1  # type: ignore[misc]
    with pytest.raises(Exception, match="frozen"):
        config.ray.namespace = "x"  # type: ignore[misc]
    dumped = dump_yaml(config)
    assert "output_dir: /tmp/out\n" in dumped
    again = write(tmp_path, "again.yaml", dumped)
    assert load_config(again) == config


def test_config_tree_and_errors_are_plain_values(tmp_path: Path) -> None:
    tree = load_tree(write(tmp_path, "main.yaml", "pipeline: sft\n"))
    assert isinstance(tree, ConfigTree) and tree.data == {"pipeline": "sft"}
    error = error_of(tmp_path / "absent.yaml")
    clone = pickle.loads(pickle.dumps(error))
    assert isinstance(clone, ConfigError) and str(clone) == str(error) and clone.issues == error.issues
    assert isinstance(error, ValueError)


def test_loader_imports_neither_torch_nor_ray() -> None:
    code = (
        "import sys, roll.core.config.loader, roll.core.config\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_overrides_cannot_grow_lists_or_index_scalars(tmp_path: Path) -> None:
    main = write(tmp_path, "main.yaml", "lst: [1]\nname: x\n")
    error = error_of(main, ("+lst.3=1", "name.first=a", "lst.5=2"))
    assert [issue.message for issue in error.issues] == [
        "lists cannot grow by index",
        "name is a str, not a mapping, so it has no key 'first'",
        "no item 'lst.5' to override",
    ]
