"""`bench MODEL`: the same prompts with drafting off and on, side by side.

A model that drafts with ``DRAFT auto`` (the default) is run with drafting off, with each of its
drafters alone (the request's ``draft`` option) and with ``auto``, and the table is followed by
the drafter ``auto`` drafted with.

Every request is greedy (temperature 0), so drafting must not change a single token: the
table says whether the outputs were identical, next to the speed and the acceptance rate.
Runs are grouped by configuration because the draft length is a load-time setting (changing
it reloads the model); each group starts with an empty request that does the loading, so
load time never counts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.console import Console

from modelhub.cli.bench_report import Config, Row, Run, bench_json, bench_table
from modelhub.cli.models import connect
from modelhub.client import Client
from modelhub.errors import InputError

DEFAULT_PROMPTS = (
    "Why is the sky blue? Answer in three sentences.",
    "Rewrite the following text with the spelling mistakes fixed and nothing else changed:\n\n"
    "The quick brown fox jumpd over the lazy dog. Then the dog woke up, streched, and "
    "chased the fox acros the field untill both of them were to tired to run any further. "
    "In the evening they sat together by the river and watched the sun go down.",
    "List the twelve months of the year, one per line, numbered from 1 to 12.",
)
DEFAULT_NUM_PREDICT = 128


def configs_for(
    draft: dict[str, Any] | None,
    bounds: Sequence[int],
    model: str = "this model",
    *,
    fixed: bool = False,
    drafting: dict[str, Any] | None = None,
) -> list[Config]:
    """Off first, then each requested bound, or the model's own setting when none is given;
    with ``fixed`` each bound twice: adaptive (``≤K``) and always K (``=K``). A model that
    drafts with ``auto`` (``drafting``, show's object) and no bound given: each of its drafters
    alone, then ``auto``."""
    auto = (drafting or {}).get("mode") == "auto"
    if auto and not bounds and not fixed:
        names = [str(d.get("name")) for d in (drafting or {}).get("drafters") or []]
        return [
            Config("off", 0),
            *(Config(name, None, drafter=name) for name in names),
            Config("auto", None, drafter="auto"),
        ]
    if auto:
        draft = {**(draft or {}), "kind": "auto"}
    if not draft:
        raise InputError(
            f"{model} does not draft (DRAFT none, or MODELHUB_DRAFT=off), so there is nothing "
            "to compare: create a model with DRAFT auto or another DRAFT line (a smaller "
            "model, mtp or ngram), see docs/modelfile.md"
        )
    own = draft.get("draft_num_predict")
    for given in bounds:
        if not 1 <= given <= 64:
            raise InputError(f"--draft-num-predict must be between 1 and 64, got {given}")
        if isinstance(own, int) and given > own:
            # a request may lower the model's bound, never raise it: the figures would be own's
            raise InputError(
                f"--draft-num-predict {given} exceeds the draft_num_predict of {model} ({own}); "
                f"to try longer drafts, create a model with PARAMETER draft_num_predict {given}"
            )
    configs = [Config("off", 0)]
    model_fixed = draft.get("draft_adaptive") is False
    chosen: list[int | None] = list(dict.fromkeys(bounds)) or [None]
    for bound in chosen:
        shown = bound if bound is not None else own
        if fixed:
            configs.append(Config(f"≤{shown}" if shown else "adaptive", bound, True))
            configs.append(Config(f"={shown}" if shown else "fixed", bound, False))
        elif model_fixed:
            configs.append(Config(f"={shown}" if shown else "on", bound))
        else:
            configs.append(Config(f"≤{shown}" if shown else "on", bound))
    return configs


def _draft_options(config: Config) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if config.draft_num_predict is not None:
        options["draft_num_predict"] = config.draft_num_predict
    if config.adaptive is not None:
        options["draft_adaptive"] = config.adaptive
    if config.drafter is not None:
        options["draft"] = config.drafter
    return options


def generate_request(model: str, prompt: str, config: Config, num_predict: int) -> dict[str, Any]:
    options: dict[str, Any] = {"temperature": 0, "num_predict": num_predict}
    options |= _draft_options(config)
    return {"model": model, "prompt": prompt, "stream": False, "options": options}


def run_from_answer(prompt: int, config: Config, answer: dict[str, Any]) -> Run:
    def number(key: str) -> int:
        value = answer.get(key)
        return int(value) if isinstance(value, int | float) else 0

    return Run(
        prompt=prompt,
        config=config.label,
        eval_count=number("eval_count"),
        eval_duration_ns=number("eval_duration"),
        draft_count=number("draft_count"),
        draft_accepted_count=number("draft_accepted_count"),
        text=str(answer.get("response") or ""),
        drafter=str(answer["drafter"]) if answer.get("drafter") else None,
    )


def _rate(runs: Sequence[Run]) -> float | None:
    seconds = sum(r.eval_duration_ns for r in runs) / 1e9
    return sum(r.eval_count for r in runs) / seconds if seconds > 0 else None


def _acceptance(runs: Sequence[Run]) -> float | None:
    proposed = sum(r.draft_count for r in runs)
    return sum(r.draft_accepted_count for r in runs) / proposed if proposed else None


def summarise(runs: Sequence[Run], prompts: Sequence[str], configs: Sequence[Config]) -> list[Row]:
    """Rows per prompt and configuration, then ``all`` rows over every prompt. Speed-up is
    against the first (off) configuration on the same prompts; identical means every output
    equals the first off output of its prompt."""
    baseline = configs[0].label
    reference = {
        p: next((r.text for r in runs if r.prompt == p and r.config == baseline), None)
        for p in range(len(prompts))
    }

    def row(label: str, config: Config, chosen: Sequence[Run], base: Sequence[Run]) -> Row:
        rate, base_rate = _rate(chosen), _rate(base)
        same: bool | None = all(r.text == reference[r.prompt] for r in chosen)
        if config.label == baseline and same:
            same = None  # the baseline agrees with itself; only a disagreement is news
        return Row(
            prompt=label,
            config=config.label,
            tokens=sum(r.eval_count for r in chosen),
            tokens_per_second=rate,
            acceptance=_acceptance(chosen),
            speedup=rate / base_rate if rate and base_rate else None,
            identical=same,
        )

    rows = []
    for index, prompt in enumerate(prompts):
        base = [r for r in runs if r.prompt == index and r.config == baseline]
        for config in configs:
            chosen = [r for r in runs if r.prompt == index and r.config == config.label]
            rows.append(row(prompt_label(prompt), config, chosen, base))
    if len(prompts) > 1:
        base = [r for r in runs if r.config == baseline]
        for config in configs:
            rows.append(row("all", config, [r for r in runs if r.config == config.label], base))
    return rows


def prompt_label(prompt: str, width: int = 24) -> str:
    """A prompt on one short line for the table."""
    flat = " ".join(prompt.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def run_bench(
    client: Client,
    model: str,
    prompts: Sequence[str],
    configs: Sequence[Config],
    *,
    num_predict: int,
    repeat: int,
    progress: Callable[[str], None] = lambda _text: None,
) -> list[Run]:
    """Every prompt ``repeat`` times under each configuration, in that order."""
    runs = []
    for config in configs:
        progress(f"loading {model} ({config.label})")
        load: dict[str, Any] = {"model": model}
        if options := _draft_options(config):
            load["options"] = options
        client.request_json("POST", "/api/generate", load)
        for index, prompt in enumerate(prompts):
            for attempt in range(repeat):
                progress(
                    f"{config.label}: prompt {index + 1}/{len(prompts)}"
                    + (f", run {attempt + 1}/{repeat}" if repeat > 1 else "")
                )
                request = generate_request(model, prompt, config, num_predict)
                answer = client.request_json("POST", "/api/generate", request) or {}
                runs.append(run_from_answer(index, config, answer))
    return runs


@click.command("bench")
@click.argument("model")
@click.option(
    "--draft-num-predict",
    "bounds",
    type=int,
    multiple=True,
    metavar="N",
    help="Draft length to try (repeatable; default: the model's own).",
)
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT", help="A prompt (repeatable).")
@click.option(
    "--num-predict",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_NUM_PREDICT,
    show_default=True,
    help="Tokens to generate per prompt.",
)
@click.option(
    "--repeat", type=click.IntRange(1, 1000), default=1, show_default=True, help="Runs per prompt."
)
@click.option(
    "--fixed",
    is_flag=True,
    help="Also run each draft length fixed (draft_adaptive false, as llama.cpp) beside adaptive.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def bench(
    model: str,
    bounds: tuple[int, ...],
    prompts: tuple[str, ...],
    num_predict: int,
    repeat: int,
    fixed: bool,
    as_json: bool,
) -> None:
    """Compare MODEL with drafting off and on: tok/s, acceptance, speed-up, identical output.

    All requests are greedy (temperature 0): speculative decoding is lossless, so the outputs
    must be identical; a difference is shown in red.
    """
    client = connect()
    shown = client.show(model)
    drafting = shown.get("drafting")
    configs = configs_for(
        shown.get("draft"), bounds, f"model '{model}'", fixed=fixed, drafting=drafting
    )
    chosen = list(prompts) or list(DEFAULT_PROMPTS)
    errors = Console(stderr=True, highlight=False)
    if errors.is_terminal:
        with errors.status("") as status:
            runs = run_bench(
                client,
                model,
                chosen,
                configs,
                num_predict=num_predict,
                repeat=repeat,
                progress=lambda text: status.update(text),
            )
    else:
        runs = run_bench(client, model, chosen, configs, num_predict=num_predict, repeat=repeat)
    rows = summarise(runs, chosen, configs)
    if as_json:
        data = bench_json(
            model, chosen, configs, rows, runs, num_predict=num_predict, repeat=repeat
        )
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    kind = str((drafting or {}).get("mode") or (shown.get("draft") or {}).get("kind") or "draft")
    title = f"{model} ({kind}): {num_predict} tokens per prompt, {repeat} run(s), greedy"
    out = Console(file=sys.stdout, highlight=False)
    out.print(bench_table(rows, title))
    if any(c.drafter == "auto" for c in configs):
        out.print(auto_choice(runs))


def auto_choice(runs: Sequence[Run]) -> str:
    """Which drafter ``auto`` drafted with, over its runs."""
    auto = [r for r in runs if r.config == "auto"]
    used = [r.drafter for r in auto if r.drafter]
    if not used:
        return f"auto drafted nothing in {len(auto)} run(s): plain decoding paid best here"
    counts = {name: used.count(name) for name in dict.fromkeys(used)}
    text = ", ".join(f"{name} in {n} of {len(auto)} run(s)" for name, n in counts.items())
    return f"auto drafted with {text}"
