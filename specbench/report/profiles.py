"""What each report profile runs: its notebooks' parameters (``PROFILES``), their expected seconds
(``EXPECTED_SECONDS``, the ETA until a report folder holds its own timings) and the run order."""

from __future__ import annotations

from typing import Any

#: Notebooks run before the others: the explorer replays the sweep's recorded outputs.
RUN_FIRST = ("draft_length_sweep",)
#: Notebooks a report runs only when named (``specbench report --only NAME``): ``compare`` builds and runs three
#: quantizations of the embedded model, minutes a CPU's full report has no room for.
ON_REQUEST = ("compare",)
#: Notebooks that read what another one records in the report folder: spread over ranks, each runs on its
#: source's rank, after it.
READS_FROM = {"sampling": "draft_length_sweep", "explorer": "draft_length_sweep"}

_TINY = "tiny:smollm2-135m"
_EMBEDDED = EMBEDDED = "smollm2-135m"
#: The embedded model's plain step on the 2-core CPU the expected times (``EXPECTED_SECONDS["full"]``) come from
#: (float32, OpenBLAS, one BLAS thread; its cost model in a fresh-clone report of 2026-12-07, at load 0.6-2): a report
#: of another model is expected to take its cost model's plain step over this times as long
#: (``specbench.report.cost_models.scaled``).
EMBEDDED_PLAIN_STEP_S = 0.093


#: Per-profile parameter overrides, per notebook (notebook defaults fill the rest).
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    # Seconds on a CPU: a random-weight miniature of the embedded model (its tokenizer, 2 layers
    # of width 64) and tiny synthetic shapes. Checks that every notebook runs and draws.
    "quick": {
        "quickstart": {"model": _TINY, "max_tokens": 12, "pairs": 2},
        "draft_length_sweep": {
            "model": _TINY,
            "draft_lengths": [1, 3],
            "policies": ["fixed", "auto"],
            "categories": ["repeated_paragraph", "qa"],
            "prompts_per_category": 1,
            "max_tokens": 16,
            "max_prompt_tokens": 0,
            "pairs": 1,
        },
        "break_even": {
            "dense_model": "synthetic:qwen3-8b-tiny",
            "moe_model": "synthetic:qwen3-30b-a3b-tiny",
            "widths": 9,  # the report's cost model: as wide as the policies page verifies
            "repeats": 2,
            "offset": 32,
            "context_lengths": [64],
            "component_widths": [1, 3],
            "acceptances": [0.5, 0.9],
            "draft_lengths": [2],
            "grid_max_tokens": 8,
        },
        "agent_traces": {"model": _TINY, "traces": ["chat-revision", "tool-agent"], "max_turns": 2, "max_tokens": 8},
        "sampling": {
            "model": _TINY,
            "temperatures": [0.0, 1.0],
            "categories": ["repeated_paragraph"],
            "max_tokens": 16,
            "lossless_samples": 4,
            "lossless_tokens": 4,
            "permutations": 200,
            "same_runs": 2,
            "same_tokens": 6,
        },
        "explorer": {"model": _TINY, "k": 3, "grid_draft_lengths": [1, 2, 3, 4]},
        "acceptance_rules": {
            "model": _TINY,
            "drafters": ["lookup", "suffix"],
            "draft_lengths": [2],
            "temperatures": [0.7, 1.0],
            "categories": ["repeated_paragraph"],
            "max_tokens": 12,
            "shift_samples": 4,
            "shift_tokens": 4,
            "permutations": 200,
        },
        # A against A: the miniature twice (the same prompts, drafter and policy)
        "compare": {
            "models": [_TINY, _TINY],
            "categories": ["translation"],
            "limit": 2,
            "max_tokens": 8,
        },
        "policies": {
            "model": _TINY,
            "traces": ["chat-revision", "tool-agent"],
            "max_turns": 2,
            "categories": ["translation", "qa", "math_reasoning"],
            "questions_per_category": 1,
            "max_prompt_tokens": 0,
            "max_tokens": 12,
        },
    },
    # The embedded model (SmolLM2-135M), sized for a 2-core CPU, where MLX runs on about one core: a float32
    # decode step takes ~0.17 s, a prompt token ~0.09 s and a width-w verification ~0.13 s per row, so every
    # figure gets the fewest generations that still draw it with counts and intervals. Greedy verification is
    # the engine's default, exact: its calibration (kept under SPECBENCH_HOME) tests each width the notebooks
    # verify against serial steps, a few seconds per width on a reference BLAS and up to ~20 s on OpenBLAS, whose
    # products are row-invariant only up to a few rows; so SuffixDecoding drafts at most 8 tokens here
    # (``suffix:8``, widths up to 9, as the policies notebook's k = 8) instead of its 16. The sweep's generations are
    # recorded in the report folder: the explorer replays other drafters, draft lengths and policies over its plain
    # outputs.
    "full": {
        # an edit of a given paragraph (the notebook's prompt): lookup's drafts are accepted; 6 pairs give an interval
        "quickstart": {"model": _EMBEDDED, "max_tokens": 32, "policy": "fixed:3", "pairs": 6},
        "draft_length_sweep": {
            # the MTP head is left out: on this CPU it is accepted ~5% of the time, and it needs every prompt
            # prefilled again for its hidden states; with it the sweep took 2.5 times as long (add it back with
            # -p draft_length_sweep.drafters=lookup,suffix,mtp)
            # The answer's sample: the copy-like kinds where drafting from the context should pay (a repeated
            # paragraph; questions over given passages) and agent turns whose replies repeat tool output (the
            # agentic kind: turns of the shipped traces by the rule in specbench.inputs.prompts.agentic_turns),
            # 3 prompts of each, each cell (drafter x kind x policy) timed in 6 pairs (2 per prompt), the
            # fewest that give an interval. Prompts of at most 2,000 tokens: every generation stays within 2,048
            # keys, where exact verification is calibrated once (up to 2,047); the agentic turns past it
            # (coding-agent's later ones, 2,600-3,900 tokens: ~40-75 s of prefill each on this CPU) are skipped
            # for the next ones, so the kind is coding-agent:2, tool-agent:1 and tool-agent:2 (862-1,798 tokens).
            "model": _EMBEDDED,
            "drafters": ["lookup", "suffix:8"],
            "draft_lengths": [3],
            "policies": ["fixed", "auto"],
            "categories": ["repeated_paragraph", "rag", "agentic"],
            "prompts_per_category": 3,
            "max_tokens": 32,
            "max_prompt_tokens": 2000,
            "pairs": 2,  # blocks of one plain run and the four methods; consecutive plain runs: the A/A cell
            # then, by a rule fixed here, a pair more per prompt for each cell whose interval still covers 1, up to
            # 4 pairs a prompt (3 looks: intervals at 98.3 %) or until the next round would pass time_budget_s.
            # The budget is what the report's 12 minutes leave after the first round of the three kinds (99 runs,
            # ~2.8 s a run: 9 reference runs, then 2 blocks of a plain run and the 4 methods per prompt; its prompts'
            # calibration at 1,023 and 2,047 keys ~60 s more before the pages): 45 s, a round of up to 16 runs (a
            # prompt's block is one plain run and its kind's open methods: the 3 rag cells still open, 12 runs). A
            # cell whose speedup is ~1.0x (rag's, 0.96-1.04x over 12 pairs before) cannot decide at any sample this
            # CPU has time for: the answer states it "no difference resolvable" with its interval.
            "max_pairs": 4,
            "time_budget_s": 45,
        },
        "break_even": {
            # the MoE: SmolLM2's layers with 16 experts, top-4 (random weights), 8 of its 30 layers (the CPU's
            # gather_mm makes its steps slow); its grid measured too (the dense-vs-MoE contrast on this machine)
            "dense_model": _EMBEDDED,
            "moe_model": "synthetic:smollm2-135m-16e-fp32",
            "moe_layers": 8,
            # the report's cost model (every page plans with it: specbench.report.cost_models): widths 1-9 (drafts
            # of up to 8 tokens, the longest any page verifies) in both modes, 5 timing rounds (intervals at 94 %)
            "widths": 9,
            "verify_modes": ["exact", "fast"],
            "repeats": 5,
            "profile_tokens": 8,
            "offset": 64,
            "context_lengths": [1024],  # c(w, L) at two lengths: 64 (the offset) and 1024
            "component_widths": [1, 5],  # the stack at one row and at five: how each part grows (~12 s a width)
            "acceptances": [0.5, 0.9],
            "draft_lengths": [2, 4],
            "grid_max_tokens": 16,
            "grid_prompt_tokens": 16,
            "grid_moe": True,
        },
        "agent_traces": {
            # a fixed draft length: on this CPU auto finds that drafting does not pay and never drafts; the MTP
            # head is left out (it needs every turn's prompt prefilled again for its hidden states)
            "model": _EMBEDDED,
            "traces": ["chat-revision"],
            "drafters": ["suffix", "lookup"],
            "max_turns": 2,
            "max_tokens": 24,
            "policy": "fixed:4",
        },
        "sampling": {
            # its greedy cell is the sweep's (same prompt, drafters, policy and tokens): recorded, not run again
            "model": _EMBEDDED,
            "drafters": ["lookup", "suffix:8"],
            "policy": "fixed:3",
            "temperatures": [0.0, 1.0],
            "categories": ["rag"],
            "max_tokens": 32,
            "lossless_samples": 10,
            "lossless_max_samples": 20,  # doubled when 10 cannot conclude (too few accepted drafts)
            "lossless_tokens": 6,
            "same_runs": 4,
            "same_tokens": 16,
        },
        # the sweep's recorded outputs replayed at every k and policy (no model runs)
        "explorer": {"model": _EMBEDDED, "policy": "fixed", "k": 3},
        "acceptance_rules": {
            # one drafter without q (lookup) and one with (the shipped draft model); the MTP head and suffix are
            # left out for time (add them with -p acceptance_rules.drafters=lookup,suffix,mtp,draft-model)
            "model": _EMBEDDED,
            "drafters": ["lookup", "draft-model"],
            "draft_lengths": [3],
            "temperatures": [0.5, 1.0],  # two ends of the usual range (three took 191 of its 246 s at load 6)
            "categories": ["translation"],
            "max_prompt_tokens": 160,
            "max_tokens": 16,
            "shift_samples": 5,
            "shift_tokens": 6,
        },
        "policies": {
            # every bundled trace replayed (no model runs); one short question (40-93 tokens; summarization's and
            # rag's are 660-770) of 3 categories recorded, and each confirmed policy run on those 3 against plain
            # decoding (3 requests: the fewest that give the measured speedup an interval)
            "model": _EMBEDDED,
            "categories": ["translation", "qa", "math_reasoning"],
            "questions_per_category": 1,
            "max_prompt_tokens": 160,
            "max_tokens": 24,
        },
    },
}


#: Seconds each notebook is expected to take (the ETA until a report folder holds its own timings), kernel start
#: and HTML export included: quick measured on the shared 2-core CPU on 2026-12-01 at load ~3; full below. The
#: run's own timings replace them.
EXPECTED_SECONDS: dict[str, dict[str, float]] = {
    "quick": {
        "quickstart": 8,
        "draft_length_sweep": 20,
        "break_even": 18,
        "agent_traces": 12,
        "sampling": 10,
        "explorer": 8,
        "batch_break_even": 8,
        "simulate_logs": 12,
        "tree_vs_path": 12,
        "acceptance_rules": 15,
        "policies": 20,
        "compare": 15,
    },
    "full": {
        # CPU seconds (its process and kernel) in one `specbench report --profile full --ranks 2` on 2026-12-07 (load
        # 5.5-6.3: others' jobs on the 2 cores, so the walls were about twice these; at load <= 2 a rank's wall is
        # about its CPU seconds), one BLAS thread per rank, exact verification calibrated once before the pages
        "quickstart": 36,
        # the answer's 6 pairs a cell on 9 prompts (3 kinds), then the sequential rule's rounds (45 s of wall at
        # most): 424 CPU s for the first round of 153 runs (a plain run per method and pair) in its library call on
        # 2026-12-07, before a block's methods shared its plain run (99 runs: ~275 s expected). No calibration of its
        # own: every prompt's context is calibrated before the pages (cost_models.prompt_contexts; one agentic turn
        # calibrated mid-run took 117 s at load 3)
        "draft_length_sweep": 310,
        "break_even": 142,  # the MoE's cost model (its calibration ~60 s) and both grids
        "agent_traces": 20,
        "sampling": 42,  # its greedy cell is the sweep's
        "explorer": 4,  # replays the sweep's recorded outputs: no model runs
        "batch_break_even": 10,  # tiny synthetic shapes in both profiles (the notebook's defaults)
        "simulate_logs": 7,  # the bundled traces, tokenized only: no model runs
        "tree_vs_path": 7,  # the traces' recorded replies (source "replies"): no model runs
        "acceptance_rules": 52,
        "policies": 40,
        # on request only (ON_REQUEST): its notebook's defaults, the three quantizations, 2,390 s on 2026-12-07 at
        # load 10 (others' jobs on the 2 cores); a report folder that holds its runs shows them again in seconds
        "compare": 2400,
    },
}
