"""Speculation on a model sharded over ranks (mlx-lm tensor parallelism, MLX's distributed engine):
the cost of a verification at group size N against 1, dense against MoE, exactness, and the speedup at
controlled acceptance, as ratios measured in one run.

    python3 -m scripts.gpu.sharded           # a host with 2 GPUs: 2 NCCL ranks, one GPU each; Qwen3-8B and
                                             # Qwen3-30B-A3B shapes, 4-bit, random weights
    python3 -m scripts.gpu.sharded --quick   # this CPU: 2 ring ranks, tiny shapes (under a minute)
    mlx.launch -n 2 --backend ring -- python3 -m scripts.gpu.sharded --quick    # the same, launched by hand

Started without a launcher it starts its own ranks with the variables mlx.launch sets: NCCL on CUDA (MLX_RANK,
MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT, CUDA_VISIBLE_DEVICES per rank, NCCL_NVLS_ENABLE=0 kept), the ring
backend elsewhere (MLX_RANK, MLX_HOSTFILE). Per shape,
every rank first loads the whole model and measures it alone (group size 1: its own copy, on its own
device, all ranks at once), and measures the controlled-acceptance grid spread over the ranks; then the
model is sharded over the group and measured again in lockstep (c(w) now includes the all-reduces), its
speculative greedy output checked against mlx-lm's greedy decoding of the same sharded model (exact and
fast verify), and the grid measured again. A phase that would not fit in --budget seconds is skipped
(rank 0 decides for all).

Writes into $OUT (or --out; default reports/gpu/sharded): sharded.json, costs.csv, exactness.csv,
grid.csv, rank<R>.log (the ranks' output); prints compact tables.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

FULL = {
    "models": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
    "widths": [1, 2, 3, 4, 5, 8, 9, 16],
    "exact_widths": [1, 2, 3, 5],
    "offset": 256,
    "repeats": 8,
    "warmup": 2,
    "plain_tokens": 16,
    "prompts": 4,
    "prompt_lengths": (96, 224),
    "max_tokens": 96,
    "draft_lengths": [2, 4, 7],
    "acceptances": [0.6, 0.8, 1.0],
    "ks": [2, 4],
    "grid_tokens": 64,
    "need_s": {"load": 60.0, "profile": 40.0, "exactness": 40.0, "grid": 40.0},
}
QUICK = {
    "models": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
    "widths": [1, 2, 4, 8],
    "exact_widths": [1, 2],
    "offset": 16,
    "repeats": 3,
    "warmup": 1,
    "plain_tokens": 4,
    "prompts": 2,
    "prompt_lengths": (12, 24),
    "max_tokens": 12,
    "draft_lengths": [2, 4],
    "acceptances": [1.0],
    "ks": [2],
    "grid_tokens": 16,
    "need_s": {"load": 1.0, "profile": 2.0, "exactness": 2.0, "grid": 2.0},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few repeats (CPU, < 60 s)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks to launch when started without a launcher")
    parser.add_argument("--backend", choices=["auto", "nccl", "ring"], default="auto", help="auto: nccl on CUDA")
    parser.add_argument("--models", default=None, help="comma list of synthetic shapes")
    parser.add_argument("--layers", type=int, default=None, help="depth of the synthetic shapes (default: full)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds: phases that would not fit are skipped")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else reports/gpu/sharded)")
    return parser.parse_args(argv)


def out_dir(args: argparse.Namespace) -> Path:
    return Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parents[2] / "reports/gpu/sharded")


# -- launching ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Start ``args.ranks`` ranks of this script, as mlx.launch would (NCCL: one process per GPU; ring:
    local ranks on consecutive ports), and wait for them."""
    import mlx.core as mx

    from specbench.common.distributed import local_ring_env

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if mx.default_device().type == mx.DeviceType.gpu else "ring"
    out = out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    if backend == "ring":
        ranks = local_ring_env(args.ranks, port, tempfile.mkdtemp(prefix="specbench-ring-"))
    else:
        common = {"MLX_WORLD_SIZE": str(args.ranks), "NCCL_HOST_IP": "127.0.0.1", "NCCL_PORT": str(port)}
        ranks = [{**common, "MLX_RANK": str(r), "CUDA_VISIBLE_DEVICES": str(r)} for r in range(args.ranks)]
    procs = []
    for rank, rank_env in enumerate(ranks):
        env = {**os.environ, **rank_env}
        env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
        log = open(out / f"rank{rank}.log", "w")
        command = [sys.executable, str(Path(__file__).resolve()), *argv]
        procs.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    codes = []
    for proc, log in procs:
        codes.append(proc.wait())
        log.close()
    return max(codes)


# -- one rank ----------------------------------------------------------------------------------


def run_rank(args: argparse.Namespace) -> None:
    from scripts.gpu.budget import Budget
    from specbench.checks import exactness
    from specbench.common import distributed
    from specbench.common.files import write_csv_atomic
    from specbench.common.identity import device_name, versions, write_result
    from specbench.cost.grid import speedup_grid
    from specbench.cost.measure import measure
    from specbench.models.load import load, shard_model

    cfg = QUICK if args.quick else FULL
    models = [m for m in (args.models or ",".join(cfg["models"])).split(",") if m]
    size, main = distributed.size(), distributed.is_main()
    out = out_dir(args)

    def say(text: str) -> None:
        if main:
            print(text, flush=True)

    budget = Budget(args.budget, say=say)

    def fits(phase: str) -> bool:
        """Rank 0 decides from its own clock; every rank follows (the ranks run in lockstep)."""
        return distributed.broadcast(budget.fits(phase, cfg["need_s"][phase]) if main else None)

    say(f"{size} ranks ({distributed.backend()}), {device_name()}, mlx {versions()['mlx']}")
    info = {"ranks": size, "backend": distributed.backend(), "device": device_name(), **versions(), "quick": args.quick}
    costs, checks, grid, summary = [], [], [], []

    def profile(model, group: int, modes: tuple[str, ...]) -> object:
        widths = {"fast": cfg["widths"], "exact": cfg["exact_widths"]}
        p = measure(
            model,
            widths={m: widths[m] for m in modes},
            verify=modes,
            offset=cfg["offset"],
            repeats=cfg["repeats"],
            warmup=cfg["warmup"],
            plain_tokens=cfg["plain_tokens"],
        )
        for mode in modes:
            for w, c, s in zip(p.widths[mode], p.costs[mode], p.seconds[mode]):
                costs.append({"shape": shape, "group": group, "mode": mode, "width": w, "c": c, "seconds": s})
        return p

    def controlled(model, p, group: int) -> None:
        rows = speedup_grid(
            model, p, acceptances=cfg["acceptances"], ks=cfg["ks"], verify="exact", max_tokens=cfg["grid_tokens"]
        )
        grid.extend({"shape": shape, "group": group, **r} for r in rows)

    for shape in models:
        if not fits("load"):
            break
        say(f"\n{shape}")
        model = load(f"synthetic:{shape}", layers=args.layers)[0]
        row = {"shape": shape, "ranks": size}
        alone = None
        if fits("profile"):  # group size 1: every rank its own whole copy, at the same time
            alone = profile(model, 1, ("fast", "exact"))
            row["plain_ms_1"] = 1e3 * alone.plain_step_s
        if alone is not None and fits("grid"):  # the grid is predicted from the profile: none without it
            controlled(model, alone, 1)
        shard_model(model, shape)
        if fits("profile"):
            sharded = profile(model, size, ("fast", "exact"))
            row["plain_ms_n"] = 1e3 * sharded.plain_step_s
            if alone is not None:
                row["plain_n_over_1"] = row["plain_ms_n"] / row["plain_ms_1"]
                for w in (2, 4, 8):
                    if w <= max(cfg["widths"]):
                        row[f"c{w}_1"], row[f"c{w}_n"] = alone.c(w, "fast"), sharded.c(w, "fast")
        if fits("exactness"):
            prompts = exactness.random_prompts(model, cfg["prompts"], cfg["prompt_lengths"])
            rows = exactness.check(model, prompts, cfg["max_tokens"], cfg["draft_lengths"]).to_dicts()
            checks.extend({"shape": shape, "group": size, **r} for r in rows)
            for mode in ("exact", "fast"):
                row[f"equal_{mode}"] = f"{sum(r['equal'] for r in rows if r['mode'] == mode)}/{len(prompts)}"
        if fits("grid") and "plain_ms_n" in row:
            controlled(model, sharded, size)
        summary.append(row)
        say("  " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
        del model
        if main:  # each shape's results as soon as they are measured
            write_result(out / "sharded.json", {"info": info, "summary": summary, "costs": costs})
    if not main:
        return
    for name, rows in (("costs", costs), ("exactness", checks), ("grid", grid)):
        write_csv_atomic(out / f"{name}.csv", rows)
    results = {"info": info, "summary": summary, "costs": costs, "grid": grid, "skipped": budget.skipped_lines()}
    write_result(out / "sharded.json", results)
    say("\nspeedup at controlled acceptance (exact verify), group size 1 -> N:")
    for shape in models:
        for a in cfg["acceptances"]:
            for k in cfg["ks"]:
                cells = {r["group"]: r for r in grid if r["shape"] == shape and r["a"] == a and r["k"] == k}
                if cells:
                    text = "  ".join(
                        f"N={g}: {r['speedup']:.2f}x (pred {r['predicted_nominal']:.2f})" for g, r in cells.items()
                    )
                    say(f"  {shape} a={a} k={k}: {text}")
    say(f"\nwrote {out}; {budget.elapsed():.0f} s")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from specbench.common.distributed import launched_backend

    if launched_backend() is None and args.ranks > 1:
        code = launch(args, argv)
        for log in sorted(out_dir(args).glob("rank*.log")):
            text = log.read_text(errors="replace")
            print(text if log.name == "rank0.log" or code else text[-2000:], end="")
        return code
    run_rank(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
