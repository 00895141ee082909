"""The agent gateway: roll serves an OpenAI-compatible API from the policy so user agents train unmodified.

For the length of a rollout, a rollout worker serves ``/v1/chat/completions`` (tool calls, ``n``, streaming),
``/v1/completions`` and ``/v1/models`` on 127.0.0.1, backed by the policy's generators. User agent code (a plain
function or a ``roll.agent`` entry point) gets a ``base_url``, an API key and a task row, talks to it with any
OpenAI client or framework, and returns a reward. Every call is recorded token in, token out, and an episode's
calls become training rows without re-tokenizing.

- :mod:`.config`: :class:`~.config.GatewayConfig` (light);
- :mod:`.formats`: tools and tool calls as text (Hermes ``<tool_call>``), :func:`~.formats.parse_tool_calls_for`;
- :mod:`.sampler`: the policy as a :class:`~.sampler.Sampler` (inference cluster or in-process) and the
  :class:`~.sampler.Batcher` that merges concurrent calls;
- :mod:`.server`: the HTTP server (stdlib ``ThreadingHTTPServer``), API key, deadlines, refusals;
- :mod:`.record`: :class:`~.record.EpisodeLog`, :class:`~.record.CallRecord` and the training rows;
- :mod:`.agents`: :class:`~.agents.AgentGateway`, which runs agents per task row and returns an
  :class:`~.agents.AgentRollout`.

Only :mod:`.config` is light; the others import the workers' sampling params (no torch until a sampler runs).
"""
