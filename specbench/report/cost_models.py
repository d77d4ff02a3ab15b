"""The report's cost models: measured once, before its notebooks, so that every page plans with the same c(w).

``prepare`` measures (or reads from the store) the cost model of each model a page plans with, by the protocol the
break-even page's parameters give (``protocol_of``); the pages read it through ``profile_for``. ``cost_model.json``
in the report folder names each one: when it was measured, how long it took, under what load, and whether it is noisy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specbench.common import distributed
from specbench.common.files import locked, write_json_atomic
from specbench.cost.model import Protocol, cost_model, current, describe
from specbench.cost.profile import Profile, check_profile, load_profile, save_profile
from specbench.report.outputs import read_json
from specbench.report.profiles import EMBEDDED, EMBEDDED_PLAIN_STEP_S

#: The file in a report folder that names the cost models its pages planned with.
FILE = "cost_model.json"
#: The notebook whose parameters fix the protocol (its own measurement reads the same stored profile).
SOURCE = "break_even"


def protocol_of(parameters: dict[str, Any]) -> Protocol:
    """The protocol the break-even page's ``parameters`` measure by (``Protocol``'s defaults where one is unset)."""
    names = {"widths": "widths", "verify_modes": "verify", "offset": "offset", "repeats": "repeats"}
    names |= {"profile_tokens": "plain_tokens", "context_lengths": "lengths"}
    given = {field: parameters[key] for key, field in names.items() if key in parameters}
    for field in ("verify", "lengths"):
        if field in given:
            given[field] = tuple(given[field] or ())
    return Protocol(**given)


def models_of(resolved: dict[str, dict[str, Any]]) -> list[str]:
    """The models the report's pages plan with, in notebook order: each ``model`` and the break-even page's
    ``dense_model`` (its MoE is measured by that page alone)."""
    names = [p.get("model") for p in resolved.values()] + [resolved.get(SOURCE, {}).get("dense_model")]
    return list(dict.fromkeys(n for n in names if isinstance(n, str) and n))


def contexts_of(resolved: dict[str, dict[str, Any]]) -> list[int]:
    """The longest contexts the report's pages' generations reach where their parameters bound them (a prompt of at
    most ``max_prompt_tokens`` and ``max_tokens`` more), longest first: exact verification is calibrated up to them
    once, before the pages (``prepare``), not by the page that first reaches them."""
    found = set()
    for parameters in resolved.values():
        prompt, tokens = parameters.get("max_prompt_tokens"), parameters.get("max_tokens")
        if type(prompt) is int and type(tokens) is int and min(prompt, tokens) > 0:  # a bool is no length
            found.add(prompt + tokens)
    return sorted(found, reverse=True)


def prompt_contexts(resolved: dict[str, dict[str, Any]], model: str, tokenizer: Any) -> list[int]:
    """The contexts of the bundled prompts the pages of ``model`` run, each prompt's own (its tokens and
    ``max_tokens`` more), longest first: a generation calibrates up to the KV step its own context reaches
    (``lengths_for``), which its page's longest context (``contexts_of``) does not cover where the page's prompts
    differ in length (a repeated paragraph's 400 tokens, an agentic turn's 900-1,800), so they are calibrated before
    the pages too. A page's prompt limit as its notebook's default where unset (1 a kind)."""
    import warnings

    from specbench.inputs.prompts import PromptsLeftOut, prompts_from

    found = set()
    for parameters in resolved.values():
        tokens, categories = parameters.get("max_tokens"), parameters.get("categories")
        if tokenizer is None or parameters.get("model") != model or type(tokens) is not int or not categories:
            continue
        if parameters.get("prompts", "bundled") != "bundled":
            continue
        limit, cap = parameters.get("prompts_per_category", 1), parameters.get("max_prompt_tokens") or None
        with warnings.catch_warnings():  # the page says which prompts its limits leave out
            warnings.simplefilter("ignore", PromptsLeftOut)
            try:
                prompts = prompts_from("bundled", tokenizer, categories, limit, True, cap)
            except ValueError:  # the page's own error, said when it runs
                continue
        found |= {len(prompt.ids) + tokens for prompt in prompts}
    return sorted(found, reverse=True)


def calibration_lengths(model: Any, protocol: Protocol, contexts: Sequence[int] = ()) -> list[int]:
    """The cache lengths exact verification is calibrated at for the report: those the cost model's own measurement
    reaches (``protocol``: its longest context and widest verification) and those of every page's ``contexts``."""
    from specbench.core.forward import context_length
    from specbench.exact.calibration import lengths_for

    limit = context_length(model)
    longest = max([protocol.offset, *protocol.lengths]) + protocol.widths
    return sorted({n for c in [longest, *contexts] for n in lengths_for(c, limit)})


def prepare(
    out: Path,
    models: list[str],
    protocol: Protocol,
    progress: Callable[[str], None] | None = None,
    contexts: Sequence[int] = (),
    pages: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Profile]:
    """The cost model of each of ``models`` by ``protocol``, measured or read on rank 0 and stored on every rank,
    and named in ``out/cost_model.json``. A model that cannot be loaded is left out (its pages say why). Before it,
    in exact mode, the widths it verifies are calibrated once for every page (``calibration_lengths`` of
    ``contexts`` and of each bundled prompt of ``pages``, the pages' parameters: ``prompt_contexts``), spread over
    the ranks (``calibrate_over_ranks``): no page calibrates them again mid-run, and the cost model is measured with
    the levels the pages run."""
    from specbench.exact.calibration import calibrate_over_ranks
    from specbench.models.load import load

    loaded: dict[str, Any] = {}
    if distributed.is_main():
        for name in models:
            try:
                loaded[name] = load(name)
            except (FileNotFoundError, ValueError) as err:
                if progress is not None:
                    progress(f"cost model of {name}: not measured ({err})")
    found: dict[str, dict[str, Any]] = {}
    for name in distributed.broadcast(list(loaded)):  # the models rank 0 could load, on every rank
        model, tokenizer = loaded.pop(name) if name in loaded else load(name)
        if "exact" in protocol.verify:
            lengths = calibration_lengths(model, protocol, [*contexts, *prompt_contexts(pages or {}, name, tokenizer)])
            calibrate_over_ranks(model, range(2, protocol.widths + 1), lengths, progress)
        if distributed.is_main():
            found[name] = cost_model(model, protocol, progress).to_dict()
        del model
    found = distributed.broadcast(found)
    profiles = {name: check_profile(data) for name, data in found.items()}
    for profile in profiles.values():  # ranks on other hosts: each reads its own store
        if not current(load_profile(profile.model, profile.device), protocol):
            save_profile(profile)
    if distributed.is_main():
        with locked(out / FILE):
            data = {"protocol": protocol.to_dict(), "models": {name: _entry(p) for name, p in profiles.items()}}
            write_json_atomic(out / FILE, data)
    return profiles


def _entry(profile: Profile) -> dict[str, Any]:
    return {"line": describe(profile), "noisy": profile.noisy, "profile": profile.to_dict()}


def record(out: str | Path | None, name: str, profile: Profile) -> None:
    """Add the cost model of ``name`` that a page measured by the report's protocol (the break-even page's MoE) to
    ``out/cost_model.json``, for the answer's break-even map (nothing outside a report: ``out`` empty)."""
    if not out:
        return
    path = Path(out) / FILE
    with locked(path):
        data = read(Path(out)) or {"protocol": None, "models": {}}
        data["models"][name] = _entry(profile)
        write_json_atomic(path, data)


def scaled(
    expected: dict[str, float | None],
    resolved: dict[str, dict[str, Any]],
    models: dict[str, Profile],
    progress: Callable[[str], None] | None = None,
) -> dict[str, float | None]:
    """Each notebook's expected seconds for the model it runs: ``EXPECTED_SECONDS`` were measured on the embedded
    model, so a notebook of another model is scaled by its cost model's plain step over the embedded model's then
    (``EMBEDDED_PLAIN_STEP_S``); the total is said through ``progress`` before the notebooks start."""
    out = dict(expected)
    for name, seconds in expected.items():
        model = resolved.get(name, {}).get("model") or resolved.get(name, {}).get("dense_model")
        if seconds and model in models and model != EMBEDDED:
            out[name] = seconds * models[model].plain_step_s / EMBEDDED_PLAIN_STEP_S
    known = [v for v in out.values() if v]
    others = sorted({m for m in models if m != EMBEDDED})
    if progress is not None and others and len(known) == len(out):
        steps = ", ".join(f"{m} {1e3 * models[m].plain_step_s:.0f} ms" for m in others)
        progress(
            f"about {sum(known) / 60:.0f} min for the notebooks, from the cost model: a plain step of {steps}, "
            f"the embedded model's {1e3 * EMBEDDED_PLAIN_STEP_S:.0f} ms when the expected times were measured"
        )
    return out


def read(out: Path) -> dict[str, Any] | None:
    """What ``prepare`` wrote into the report folder ``out`` (None when it wrote nothing)."""
    data = read_json(Path(out) / FILE)
    return data if data is not None and isinstance(data.get("models"), dict) else None


def recorded(out: Path) -> dict[str, tuple[Profile, str]]:
    """Each cost model ``out/cost_model.json`` names, checked (``check_profile``; an entry that fails is left out) and
    named as recorded, with the line that describes it."""
    found = {}
    for name, entry in ((read(out) or {}).get("models") or {}).items():
        try:
            profile = check_profile(entry["profile"])
        except (KeyError, TypeError, ValueError):
            continue
        profile.name = name
        found[name] = (profile, str(entry.get("line", "")))
    return found
