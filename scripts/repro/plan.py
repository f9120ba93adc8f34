"""The reduced-scale reproduction of the DAPE V2 paper (issue 7) as a list of jobs.

Every language-model job trains the `small` preset (6 layers, d 384, 12 heads) with the same data,
tokenizer, seed policy and token budget (2000 steps x 8192 tokens), then evaluates it with the same
windows. `python scripts/repro/plan.py > plan.json` writes the plan that run_jobs.py executes.
Jobs are listed in priority order: the machine may be taken back before the last ones run.
"""

import json
import os
import sys

# REPRO_SMOKE=1: the same plan at toy sizes on a CPU, to check every command before device time is spent.
SMOKE = os.environ.get("REPRO_SMOKE") == "1"
STEPS = 4 if SMOKE else 2000
TOKENS_PER_STEP = 64 * 128  # the batch shrinks as the training length grows: same tokens per method

RUN1 = ["cope", "xl", "fire", "dape-kerple", "dapev2-kerple", "dapev2-rope", "dapev2-nope", "stickbreaking",
        "nope", "rope", "t5", "alibi", "kerple"]  # slow ones first: they balance the GPUs
HEADLINE = ["rope", "kerple", "dape-kerple", "dapev2-kerple", "stickbreaking"]
CHE_METHODS = ["rope", "alibi", "kerple", "dape-kerple", "dapev2-kerple", "stickbreaking"]
TIMING_METHODS = ["nope", "rope", "t5", "alibi", "kerple", "fire", "cope", "xl", "dape-kerple", "dapev2-kerple",
                  "dapev2-rope", "dapev2-nope", "stickbreaking"]
RUNS = "runs/repro"


def lm_job(experiment: str, method: str, seed: int = 0, seq_len: int = 128, corpus: str = "tech",
           max_length: int = 8192, extra: tuple = (), name: str | None = None, maps: bool = False) -> dict:
    name = name or f"{method}-s{seed}"
    run = f"{RUNS}/{experiment}/{name}"
    sets = [f"model.method={method}", f"train.seed={seed}", f"train.steps={STEPS}", f"train.seq_len={seq_len}",
            f"train.batch_size={TOKENS_PER_STEP // seq_len}", f"train.ckpt_every={STEPS // 2}",
            f"data.corpus={corpus}", f"eval.max_length={max_length}", *extra]
    if SMOKE:
        sets += ["model.n_layer=6", "model.d_model=96", "eval.windows=2", f"eval.max_length={2 * seq_len + 256}",
                 "train.device=cpu"]
    cmd = ("python3 -m lenx train -c small " + " ".join(f"--set {s}" for s in sets) + f" --out {run} --no-progress"
           f" && python3 -m lenx eval {run} --no-progress")
    if maps:  # the paper's appendix K pictures: raw scores, bias, processed scores (layers 0 and 5, head 0)
        cmd += "".join(f" && python3 -m lenx plot {run} --attention --length 256 --layer {layer} --head 0"
                       for layer in (0, 5))
    return {"id": f"{experiment}/{name}", "kind": "lm", "run": run, "cmd": cmd}


def che_job(method: str, seed: int) -> dict:
    run = f"{RUNS}/che/{method}-s{seed}"
    cmd = (f"python3 -m lenx che --preset gpu --methods {method} --seeds {seed} --steps 2000 --test-samples 256 "
           f"--test-length-step 5 --out {run} --no-progress")
    if SMOKE:
        cmd = cmd.replace("--steps 2000", "--steps 2") + " --tasks parity_check,reverse_string --test-max-length 50"
    return {"id": f"che/{method}-s{seed}", "kind": "small", "run": run, "cmd": cmd}


def timing_job() -> dict:
    run = f"{RUNS}/timing"
    cmd = (f"mkdir -p {run} && python3 -m lenx bench --train-step --preset 125m --seq-len 512 --batch 32 "
           f"--steps 20 --methods {','.join(TIMING_METHODS)} --out {run}/train_step.json")
    if SMOKE:
        cmd = cmd.replace("--preset 125m --seq-len 512 --batch 32 --steps 20", "--preset tiny --seq-len 64 --batch 2 "
                          "--steps 2 --device cpu")
    return {"id": "timing", "kind": "exclusive", "run": run, "cmd": cmd}


def plan() -> list[dict]:
    jobs = [timing_job()]
    jobs += [che_job(m, s) for s in (0, 1) for m in CHE_METHODS]
    # Run 1 (figures 1, 2, 5): train at 128 on tech, evaluate 256 .. 16384.
    jobs += [lm_job("tech-T128", m, max_length=16384, maps=m in ("kerple", "dapev2-kerple")) for m in RUN1]
    # Run 4 (section 4.5): the leaking DAPE V2 (no tril) next to the leak-free one of run 1.
    jobs.append(lm_job("leak", "dapev2-kerple", extra=("model.dape_leak=true",), name="dapev2-kerple-leak-s0"))
    # Run 3 (table 4): kernel sizes 1, 5, 7 (k = 3 is run 1's dapev2-kerple).
    jobs += [lm_job("kernel-size", "dapev2-kerple", max_length=16384, extra=(f"model.dape_kernel={k}",),
                    name=f"dapev2-kerple-k{k}-s0") for k in (1, 5, 7)]
    # Run 2: training length 512 on tech, and 128 on books.
    jobs += [lm_job("tech-T512", m, seq_len=512) for m in HEADLINE]
    jobs += [lm_job("books-T128", m, corpus="books") for m in HEADLINE]
    # Figure 5's other bases.
    jobs += [lm_job("tech-T128", m, max_length=16384) for m in ("dapev2-alibi", "dapev2-fire")]
    # More seeds for run 1: the headline methods first.
    rest = [m for m in RUN1 if m not in HEADLINE]
    jobs += [lm_job("tech-T128", m, seed=s, max_length=16384) for s in (1, 2) for m in HEADLINE]
    jobs += [lm_job("tech-T128", m, seed=s, max_length=16384) for s in (1, 2) for m in rest]
    return jobs


if __name__ == "__main__":
    json.dump(plan(), sys.stdout, indent=1)
