"""The embedded default task: a synthetic tool-calling world in the ToolRL format.

Everything is a deterministic function of `SyntheticToolsConfig` (the seed included):

  tools           `tool_world.TOOLS`: 38 tools with typed parameters (string, integer, number,
                  boolean) drawn from small vocabularies, JSON-schema-like descriptions and
                  several request phrasings each.
  requests        a phrasing filled with slot values; the system prompt lists `num_candidates`
                  tools (the right ones plus distractors, shuffled) in the ToolRL layout. About
                  `response_fraction` of the requests need a plain `<response>` (small talk, or a
                  request no listed tool can serve); about `multi_call_fraction` need two calls.
  ground truths   `<think> ... </think>` then a `<tool_call>` block with one
                  `{"name": ..., "parameters": {...}}` JSON object per line, or a
                  `<response> ... </response>` block; scored by
                  `gd2po_jax.rewards.tool_calling.score_tool_call`.
  demonstrations  imperfect targets for a supervised warm start: think blocks of
                  `min_think_words..max_think_words` words and, with probability
                  `mistake_rate`, one mistake (wrong value, missing parameter, wrong tool,
                  malformed output).

`make_splits(config)` returns train / validation / test `datasets.Dataset`s in the schema of
`gd2po_jax.data.loaders.FEATURES`, with disjoint user requests, so the trainer reads them like any
user data:

  prompt        [system: tool list + output format,
                 user: "**Dialogue Records History**\\n<user> {request} </user>"]
  ground_truth  the ToolRL ground truth
  target        the (imperfect) demonstration
  level         number of tool calls the request needs (0 for a plain response, 1, 2)
  source        "synthetic_tools"
  row           0-based index in its split

Each split is drawn from its own random stream (test first, then validation, then train, each
skipping requests already drawn), so changing `num_train` leaves validation and test unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import datasets

from gd2po_jax.tasks.base import dataset_splits
from gd2po_jax.tasks.synthetic_tools.world import (
    FILLER,
    GREETINGS,
    INTRODUCTIONS,
    SMALL_TALK,
    TOOLS,
    TOOLS_BY_NAME,
    Param,
    Tool,
)

SOURCE = "synthetic_tools"
SPLITS = ("train", "validation", "test")
MISTAKES = ("wrong_value", "missing_parameter", "wrong_tool", "malformed")
"""Mistake kinds of the demonstrations of requests that need a call."""

Call = tuple[str, dict[str, Any]]
"""A tool call: (tool name, parameters)."""

SYSTEM_HEADER = "You are a helpful assistant that can call tools.\n\n**Available Tools**\n"
# One line of format instructions: every token of the system prompt is paid for in every SFT and
# RL step, and the longest prompt must fit a 192-token bucket (`gd2po_jax.models.sampling.bucket_length`).
SYSTEM_FOOTER = "\n\nAnswer with <think> </think>, then <tool_call> </tool_call> or <response> </response>."
USER_PREFIX = "**Dialogue Records History**\n<user> "
USER_SUFFIX = " </user>"


# ---------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class SyntheticToolsConfig:
    """What `make_splits` generates; every field is validated (errors name the field).

    Attributes:
      seed: the seed of all random draws.
      num_train, num_validation, num_test: rows per split.
      num_candidates: tools listed in each system prompt (>= 2 when multi_call_fraction > 0).
      response_fraction: share of requests needing a plain response (half small talk, half a
        request that no listed tool can serve).
      multi_call_fraction: share of requests needing two calls.
      mistake_rate: probability that a demonstration has one mistake.
      min_think_words, max_think_words: word range of the demonstrations' think blocks
        (two-call requests use at most half of `max_think_words`, to keep completions short).
      mistakes: the mistake kinds drawn (uniformly) for requests that need a call, from `MISTAKES`.
      habit_fraction: share of the tools (drawn by seed, see `habit_tools`) whose demonstrations
        always leave out the tool's last parameter. Random mistakes are noise that greedy
        decoding of a warm-started model averages away; a habit is learned as the behaviour.
      habit_rate: probability that a demonstration of a habit tool has the habit (1: always).
        Below 1 the right call is in the demonstrations too, as the minority: the warm-started
        model decodes the habit greedily but samples the right call now and then, which is what
        a reward for correctness can act on.
    """

    seed: int = 0
    num_train: int = 2000
    num_validation: int = 128
    num_test: int = 256
    num_candidates: int = 3
    response_fraction: float = 0.2
    multi_call_fraction: float = 0.1
    mistake_rate: float = 0.5
    min_think_words: int = 4
    max_think_words: int = 36
    mistakes: tuple[str, ...] = MISTAKES
    habit_fraction: float = 0.0
    habit_rate: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "mistakes", tuple(self.mistakes))
        for name in (
            "seed",
            "num_train",
            "num_validation",
            "num_test",
            "num_candidates",
            "min_think_words",
            "max_think_words",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SyntheticToolsConfig.{name} must be an int >= 0, got {value!r}")
        for name in ("response_fraction", "multi_call_fraction", "mistake_rate", "habit_fraction", "habit_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"SyntheticToolsConfig.{name} must be in [0, 1], got {value!r}")
        if self.response_fraction + self.multi_call_fraction > 1:
            raise ValueError(
                "SyntheticToolsConfig.response_fraction + multi_call_fraction must be <= 1, got "
                f"{self.response_fraction} + {self.multi_call_fraction}"
            )
        need = 2 if self.multi_call_fraction > 0 else 1
        if not need <= self.num_candidates <= len(TOOLS):
            raise ValueError(
                f"SyntheticToolsConfig.num_candidates must be in [{need}, {len(TOOLS)}] "
                f"(2 or more when multi_call_fraction > 0), got {self.num_candidates}"
            )
        if not 1 <= self.min_think_words <= self.max_think_words:
            raise ValueError(
                "SyntheticToolsConfig needs 1 <= min_think_words <= max_think_words, got "
                f"{self.min_think_words}, {self.max_think_words}"
            )
        unknown = [m for m in self.mistakes if m not in MISTAKES]
        if not self.mistakes or unknown:
            raise ValueError(
                f"SyntheticToolsConfig.mistakes must be a non-empty subset of {MISTAKES}, got {self.mistakes!r}"
            )


# ---------------------------------------------------------------- requests


@dataclasses.dataclass(frozen=True)
class ToolRequest:
    """One generated request and its answer.

    Attributes:
      kind: "call", "multi_call", "small_talk" or "unservable".
      user: the user's request text.
      candidates: names of the tools listed in the system prompt, in order.
      calls: the calls that answer it (empty when a plain response is needed).
      needs: what the user wants, in words, one per requested tool (empty for small talk).
      reply: the plain response text (None when calls answer the request).
    """

    kind: str
    user: str
    candidates: tuple[str, ...]
    calls: tuple[Call, ...]
    needs: tuple[str, ...]
    reply: str | None


def sample_call(tool: Tool, rng: random.Random) -> tuple[str, dict[str, Any]]:
    """(request text, parameters) for `tool`: one phrasing with slot values drawn by `rng`."""
    while True:
        values = {p.name: rng.choice(p.values) for p in tool.params}
        picked = [values[name] for name in tool.distinct]
        if len(set(picked)) == len(picked):
            break
    said = {p.name: p.say(values[p.name]) for p in tool.params}
    return rng.choice(tool.templates).format(**said), values


def _pick_candidates(
    rng: random.Random, wanted: Sequence[str], num: int, exclude: Tool | None = None
) -> tuple[str, ...]:
    """`wanted` plus distractors drawn by `rng`, shuffled. Distractors are never in `wanted`,
    never `exclude` and never of `exclude`'s family."""

    def allowed(t: Tool) -> bool:
        if t.name in wanted:
            return False
        if exclude is None:
            return True
        return t.name != exclude.name and not (exclude.family and t.family == exclude.family)

    pool = [t.name for t in TOOLS if allowed(t)]
    if len(pool) < num - len(wanted):
        raise ValueError(
            f"SyntheticToolsConfig.num_candidates={num} is more than the {len(pool) + len(wanted)} "
            "tools that can be listed for this request; lower it"
        )
    names = list(wanted) + rng.sample(pool, num - len(wanted))
    rng.shuffle(names)
    return tuple(names)


def _call_request(rng: random.Random, num_candidates: int) -> ToolRequest:
    tool = rng.choice(TOOLS)
    user, params = sample_call(tool, rng)
    candidates = _pick_candidates(rng, [tool.name], num_candidates)
    return ToolRequest("call", user, candidates, ((tool.name, params),), (tool.need,), None)


def _multi_call_request(rng: random.Random, num_candidates: int) -> ToolRequest:
    first, second = rng.sample(TOOLS, 2)
    user1, params1 = sample_call(first, rng)
    user2, params2 = sample_call(second, rng)
    candidates = _pick_candidates(rng, [first.name, second.name], num_candidates)
    calls = ((first.name, params1), (second.name, params2))
    return ToolRequest("multi_call", f"{user1} {user2}", candidates, calls, (first.need, second.need), None)


def _small_talk_request(rng: random.Random, num_candidates: int) -> ToolRequest:
    question, reply = rng.choice(SMALL_TALK)
    user = f"{rng.choice(GREETINGS)}!{rng.choice(INTRODUCTIONS)} {question}"
    return ToolRequest("small_talk", user, _pick_candidates(rng, [], num_candidates), (), (), reply)


def _unservable_request(rng: random.Random, num_candidates: int) -> ToolRequest:
    tool = rng.choice(TOOLS)
    user, _ = sample_call(tool, rng)
    candidates = _pick_candidates(rng, [], num_candidates, exclude=tool)
    reply = f"Sorry, none of my tools can {tool.need}."
    return ToolRequest("unservable", user, candidates, (), (tool.need,), reply)


def sample_request(rng: random.Random, config: SyntheticToolsConfig) -> ToolRequest:
    """One request of a kind drawn with the config's fractions."""
    u = rng.random()
    if u < config.multi_call_fraction:
        return _multi_call_request(rng, config.num_candidates)
    u -= config.multi_call_fraction
    if u < config.response_fraction / 2:
        return _small_talk_request(rng, config.num_candidates)
    if u < config.response_fraction:
        return _unservable_request(rng, config.num_candidates)
    return _call_request(rng, config.num_candidates)


def generate_requests(config: SyntheticToolsConfig) -> dict[str, list[ToolRequest]]:
    """Requests per split (keys `SPLITS`), with no user text in two splits or twice in one.

    Raises:
      ValueError: when the world has too few distinct requests for the asked sizes.
    """
    sizes = {
        "test": config.num_test,
        "validation": config.num_validation,
        "train": config.num_train,
    }
    seen: set[str] = set()
    out: dict[str, list[ToolRequest]] = {}
    for split in ("test", "validation", "train"):
        rng = random.Random(f"synthetic_tools/{config.seed}/{split}")
        requests: list[ToolRequest] = []
        attempts = 0
        while len(requests) < sizes[split]:
            attempts += 1
            if attempts > 50 * sizes[split] + 1000:
                raise ValueError(
                    f"only {len(requests)} distinct {split} requests found after {attempts} draws; "
                    "lower SyntheticToolsConfig.num_train / num_validation / num_test"
                )
            request = sample_request(rng, config)
            if request.user not in seen:
                seen.add(request.user)
                requests.append(request)
        out[split] = requests
    return {split: out[split] for split in SPLITS}


# ---------------------------------------------------------------- texts


def system_prompt(candidates: Sequence[str]) -> str:
    """The ToolRL-style system prompt listing the tools named in `candidates`, in order."""
    lines = []
    for i, name in enumerate(candidates, start=1):
        tool = TOOLS_BY_NAME[name]
        lines.append(f"{i}. Name: {tool.name}\nDescription: {tool.description}")
        lines.append(f"Parameters: {tool.schema_text()}")
    return SYSTEM_HEADER + "\n".join(lines) + SYSTEM_FOOTER


def user_message(text: str) -> str:
    """The user turn in the ToolRL dialogue-history layout."""
    return f"{USER_PREFIX}{text}{USER_SUFFIX}"


def prompt_messages(request: ToolRequest) -> list[dict[str, str]]:
    """[system, user] chat messages of a request."""
    return [
        {"role": "system", "content": system_prompt(request.candidates)},
        {"role": "user", "content": user_message(request.user)},
    ]


def call_line(name: str, params: Mapping[str, Any]) -> str:
    """One call as the JSON line of a `<tool_call>` block."""
    return json.dumps({"name": name, "parameters": dict(params)})


def _answer(think: str, calls: Sequence[Call], reply: str | None) -> str:
    """`<think> think </think>` followed by the tool-call block or the response block."""
    head = f"<think> {think} </think>\n"
    if calls:
        return head + "<tool_call>\n" + "\n".join(call_line(n, p) for n, p in calls) + "\n</tool_call>"
    return head + f"<response> {reply} </response>"


def _reason_sentences(request: ToolRequest) -> list[str]:
    """The sentences that explain the right answer, in order."""
    if request.kind == "small_talk":
        return ["The user is making small talk.", "No tool is needed, so I reply in words."]
    if request.kind == "unservable":
        return [
            f"The user wants to {request.needs[0]}.",
            "None of the listed tools can do that.",
            "I should say so in a response.",
        ]
    names = " and ".join(n for n, _ in request.calls)
    out = [f"The user wants to {' and '.join(request.needs)}.", f"I will call {names}."]
    for _, params in request.calls:
        out += [f"{k} is {json.dumps(v)}." for k, v in params.items()]
    return out


def ground_truth(request: ToolRequest) -> str:
    """The ToolRL ground truth of a request (short think, then the calls or the response)."""
    return _answer(" ".join(_reason_sentences(request)[:2]), request.calls, request.reply)


def think_text(request: ToolRequest, num_words: int, rng: random.Random) -> str:
    """Reasoning of exactly `num_words` whitespace-separated words: the explaining sentences,
    then filler sentences (shuffled by `rng`, none repeated before all are used), cut to length
    and ended with a period."""
    words = " ".join(_reason_sentences(request)).split()
    while len(words) < num_words:
        filler = list(FILLER)
        rng.shuffle(filler)
        words += " ".join(filler).split()
    words = words[:num_words]
    if not words[-1].endswith("."):
        words[-1] = words[-1].rstrip(",:;") + "."
    return " ".join(words)


# ---------------------------------------------------------------- demonstrations


def _other_value(param: Param, value: Any, rng: random.Random) -> Any:
    return rng.choice([v for v in param.values if v != value])


def _wrong_value(calls: list[Call], rng: random.Random) -> list[Call]:
    i = rng.randrange(len(calls))
    name, params = calls[i]
    tool = TOOLS_BY_NAME[name]
    param = rng.choice([p for p in tool.params if len(p.values) > 1])
    calls[i] = (name, {**params, param.name: _other_value(param, params[param.name], rng)})
    return calls


def _missing_parameter(calls: list[Call], rng: random.Random) -> list[Call]:
    i = rng.randrange(len(calls))
    name, params = calls[i]
    if len(calls) > 1 and rng.random() < 0.5:  # a two-call request: drop a whole call
        return calls[:i] + calls[i + 1 :]
    dropped = rng.choice(list(params))
    calls[i] = (name, {k: v for k, v in params.items() if k != dropped})
    return calls


def _wrong_tool(calls: list[Call], candidates: Sequence[str], rng: random.Random) -> list[Call]:
    wanted = {n for n, _ in calls}
    others = [c for c in candidates if c not in wanted] or [t.name for t in TOOLS if t.name not in wanted]
    i = rng.randrange(len(calls))
    name = rng.choice(others)
    calls[i] = (name, sample_call(TOOLS_BY_NAME[name], rng)[1])
    return calls


def _malformed(think: str, calls: Sequence[Call], rng: random.Random) -> str:
    """A call answer whose layout is broken: no think block, Python-style quotes (not JSON), or
    no closing `</tool_call>`."""
    how = rng.choice(("no_think", "python_quotes", "unclosed"))
    if how == "no_think":
        return _answer(think, calls, None).partition("</think>\n")[2]
    if how == "python_quotes":
        lines = "\n".join(str({"name": n, "parameters": dict(p)}) for n, p in calls)
        return f"<think> {think} </think>\n<tool_call>\n{lines}\n</tool_call>"
    return _answer(think, calls, None).removesuffix("\n</tool_call>")


def _response_mistake(request: ToolRequest, think: str, rng: random.Random) -> str:
    """A response-only request answered wrongly: a needless call, or an unclosed response."""
    if rng.random() < 0.5:
        name = rng.choice(request.candidates)
        return _answer(think, [(name, sample_call(TOOLS_BY_NAME[name], rng)[1])], None)
    return _answer(think, (), request.reply).removesuffix(" </response>")


@functools.lru_cache(maxsize=16)
def habit_tools(seed: int, habit_fraction: float) -> frozenset[str]:
    """Names of the `round(habit_fraction * len(TOOLS))` tools with a habitual mistake."""
    rng = random.Random(f"synthetic_tools/{seed}/habits")
    return frozenset(rng.sample(sorted(TOOLS_BY_NAME), round(habit_fraction * len(TOOLS))))


def _habit(calls: Sequence[Call], habits: frozenset[str]) -> list[Call]:
    """`calls` with the last parameter of every habit tool's call left out."""
    out = []
    for name, params in calls:
        if name in habits:
            params = dict(list(params.items())[:-1])
        out.append((name, params))
    return out


def demonstration(request: ToolRequest, config: SyntheticToolsConfig, rng: random.Random) -> tuple[str, str | None]:
    """(target text, mistake kind or None): an imperfect demonstration of `request`.

    The think block has a uniform number of words in [min_think_words, max_think_words] (at most
    half the maximum for two-call requests). A request for a habit tool (`habit_tools`) gets the
    habit (kind "habit") with probability `habit_rate`; otherwise, with probability `mistake_rate`, the
    answer has one mistake from `config.mistakes` (requests that need a response get a needless call or
    an unclosed response instead, reported as "malformed").
    """
    high = config.max_think_words
    if len(request.calls) > 1:
        high = max(config.min_think_words, high // 2)
    think = think_text(request, rng.randint(config.min_think_words, high), rng)
    habits = habit_tools(config.seed, config.habit_fraction)
    if any(name in habits for name, _ in request.calls) and (
        config.habit_rate >= 1 or rng.random() < config.habit_rate
    ):
        return _answer(think, _habit(request.calls, habits), None), "habit"
    if rng.random() >= config.mistake_rate:
        return _answer(think, request.calls, request.reply), None
    if not request.calls:
        return _response_mistake(request, think, rng), "malformed"
    kind = rng.choice(config.mistakes)
    calls = list(request.calls)
    if kind == "wrong_value":
        return _answer(think, _wrong_value(calls, rng), None), kind
    if kind == "missing_parameter":
        return _answer(think, _missing_parameter(calls, rng), None), kind
    if kind == "wrong_tool":
        return _answer(think, _wrong_tool(calls, request.candidates, rng), None), kind
    return _malformed(think, calls, rng), kind


# ---------------------------------------------------------------- datasets


def _rows(requests: Sequence[ToolRequest], split: str, config: SyntheticToolsConfig) -> list[dict]:
    rows = []
    for index, request in enumerate(requests):
        rng = random.Random(f"synthetic_tools/{config.seed}/{split}/demo/{index}")
        target, _ = demonstration(request, config, rng)
        rows.append(
            {
                "prompt": prompt_messages(request),
                "ground_truth": ground_truth(request),
                "target": target,
                "level": len(request.calls),
                "source": SOURCE,
                "row": index,
            }
        )
    return rows


def make_splits(config: SyntheticToolsConfig | None = None) -> datasets.DatasetDict:
    """Train / validation / test datasets (schema `gd2po_jax.data.loaders.FEATURES`)."""
    config = config or SyntheticToolsConfig()
    requests = generate_requests(config)
    return dataset_splits({split: _rows(requests[split], split, config) for split in SPLITS})


def iter_corpus(*parts: datasets.Dataset | Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """Every text of the given datasets (system prompts, user messages, targets, ground truths),
    for tokenizer training. Accepts datasets or any iterables of rows in the `FEATURES` schema."""
    for part in parts:
        for row in part:
            for message in row["prompt"]:
                yield message["content"]
            for field in ("target", "ground_truth"):
                if row.get(field):
                    yield row[field]


def tool_corpus() -> Iterator[str]:
    """One system prompt per tool and every phrasing: the world's vocabulary, whatever the split."""
    for tool in TOOLS:
        yield system_prompt([tool.name])
        for template in tool.templates:
            yield template.translate(str.maketrans("", "", "{}"))
    yield from (reply for _, reply in SMALL_TALK)
    yield from FILLER


__all__ = [
    "MISTAKES",
    "SOURCE",
    "SPLITS",
    "TOOLS",
    "TOOLS_BY_NAME",
    "Param",
    "ToolRequest",
    "SyntheticToolsConfig",
    "Tool",
    "call_line",
    "demonstration",
    "generate_requests",
    "habit_tools",
    "ground_truth",
    "iter_corpus",
    "make_splits",
    "prompt_messages",
    "sample_call",
    "sample_request",
    "system_prompt",
    "think_text",
    "tool_corpus",
    "user_message",
]
