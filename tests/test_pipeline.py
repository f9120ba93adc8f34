"""Config, training (resume, NaN stop), evaluation protocol, sweep, plots and the CLI, on tiny runs."""

import json
import math
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from lenx.config import ConfigError, load_config, to_toml
from lenx.evaluation.evaluate import eval_windows, evaluate
from lenx.model import LM
from lenx.model.checkpoint import CheckpointError, checkpoint_dir
from lenx.runs import load_run, open_training_corpus
from lenx.training.loop import TrainingDiverged, train
from lenx.training.optim import lr_at

TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
        "eval.max_length=128", "eval.windows=4", "eval.scored=16", "train.log_every=1"]


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def tiny(data_root, *extra):
    return load_config("tiny", TINY + [f"data.root={str(data_root)!r}", *extra])


# --- config ---------------------------------------------------------------------------------------

def test_overrides_and_suggestions():
    cfg = load_config("tiny", ["train.lr=3e-4", "model.method=dapev2-kerple", "eval.lengths=[128, 256]"])
    assert cfg.train.lr == 3e-4 and cfg.model.method == "dapev2-kerple" and cfg.eval.lengths == [128, 256]
    with pytest.raises(ConfigError, match="did you mean train.steps"):
        load_config("tiny", ["train.stpes=3"])
    with pytest.raises(ConfigError, match="did you mean 'train'"):
        load_config("tiny", ["trian.steps=3"])
    with pytest.raises(ConfigError, match="must be an integer"):
        load_config("tiny", ["train.steps=many"])
    with pytest.raises(ConfigError, match="did you mean 'tiny'"):
        load_config("tinyy")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("small", ["model.method=stickbreaking", "eval.lengths=[128]"])
    (tmp_path / "c.toml").write_text(to_toml(cfg))
    assert load_config(tmp_path / "c.toml") == cfg


def test_every_preset_loads():
    for name in ("tiny", "small", "125m", "350m"):
        load_config(name)


def test_lr_schedule_warmup_then_cosine_to_a_tenth():
    cfg = load_config("tiny", ["train.steps=1000", "train.lr=1.0", "train.warmup_frac=0.1"])
    lrs = [lr_at(s, cfg) for s in range(1000)]
    assert lrs[0] == pytest.approx(0.01) and lrs[99] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[100:], lrs[101:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-4)


# --- the model at any length ----------------------------------------------------------------------

@pytest.mark.parametrize("method", ["rope", "dapev2-kerple", "stickbreaking", "fire", "cope", "xl", "t5"])
def test_train_short_then_run_long(method):
    from lenx.config import LMConfig

    torch.manual_seed(0)
    model = LM(LMConfig(method=method, n_layer=2, n_head=3, d_model=24, vocab_size=50, chunk_size=64))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(5):
        x = torch.randint(0, 50, (4, 65))
        _, loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        logits, _ = model(torch.randint(0, 50, (1, 512)))
    assert logits.shape == (1, 512, 50) and torch.isfinite(logits).all()
    # No buffer grows with the sequence length: the model holds nothing T x T.
    assert all(b.numel() < 1024 for b in model.buffers())


def test_state_dict_round_trip(tmp_path):
    from safetensors.torch import load_model, save_model

    from lenx.config import LMConfig

    cfg = LMConfig(method="t5", n_layer=2, n_head=2, d_model=16)
    a, b = LM(cfg), LM(cfg)
    save_model(a, str(tmp_path / "m.safetensors"))
    load_model(b, str(tmp_path / "m.safetensors"))
    x = torch.randint(0, 256, (2, 20))
    assert torch.equal(a(x)[0], b(x)[0])


def test_cpu_forward_at_8192_within_4_gib():
    """A 1-layer DAPE V2 model runs a forward at T = 8192 on the chunked path in < 4 GiB resident."""
    code = (
        "import resource, torch\n"
        "from lenx.config import LMConfig\nfrom lenx.model import LM\n"
        "m = LM(LMConfig(method='dapev2-kerple', n_layer=1, n_head=4, d_model=64, chunk_size=256)).eval()\n"
        "assert m.backends(torch.device('cpu')) == ['chunked']\n"
        "with torch.no_grad(): m(torch.randint(0, 256, (1, 8192)))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    peak_gib = int(out.stdout.strip()) / 2 ** 20
    assert peak_gib < 4.0, f"peak resident memory {peak_gib:.2f} GiB"


# --- training -------------------------------------------------------------------------------------

def test_resume_after_kill_matches_uninterrupted(data_root, tmp_path):
    """Kill a real `lenx train` process after its first checkpoint, resume it, and compare with a run
    that was never interrupted: same loss curve. The run is set to far more steps than it can take
    before the kill, however late this test wakes; both are compared 20 steps past the checkpoint."""
    overrides = TINY + [f"data.root={str(data_root)!r}", "train.steps=1000000", "train.ckpt_every=10",
                        "model.method=dapev2-kerple"]
    args = [sys.executable, "-m", "lenx", "train", "--no-progress", "-o", str(tmp_path / "killed")]
    for o in overrides:
        args += ["--set", o]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while checkpoint_dir(tmp_path / "killed") is None and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = torch.load(checkpoint_dir(tmp_path / "killed") / "state.pt", weights_only=False)
    end = state["step"] + 20
    resumed = train(None, tmp_path / "killed", resume=True, progress=False, until=end)
    full = train(load_config("tiny", overrides), tmp_path / "full", progress=False, until=end)
    assert resumed["step"] == full["step"] == end
    assert resumed["final_loss"] == pytest.approx(full["final_loss"], rel=1e-6)
    curve = lambda p: [json.loads(line)["loss"] for line in (p / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    np.testing.assert_allclose(curve(tmp_path / "killed"), curve(tmp_path / "full"), rtol=1e-6)


def test_nan_loss_stops_with_step_and_keeps_last_checkpoint(data_root, tmp_path, monkeypatch):
    real = LM.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None):
        logits, loss = real(self, idx, targets)
        calls["n"] += 1
        return logits, (loss * float("nan") if calls["n"] > 7 else loss)

    monkeypatch.setattr(LM, "forward", poisoned)
    with pytest.raises(TrainingDiverged, match="at step 8.*ckpt"):
        train(tiny(data_root, "train.steps=20", "train.ckpt_every=5"), tmp_path / "run", progress=False)
    state = torch.load(checkpoint_dir(tmp_path / "run") / "state.pt", weights_only=False)
    assert state["step"] == 5


def test_refuses_to_overwrite_and_reports_corrupt_checkpoints(data_root, tmp_path):
    cfg = tiny(data_root, "train.steps=3")
    train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="--resume"):
        train(cfg, tmp_path / "run", progress=False)
    (tmp_path / "run" / "ckpt" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="corrupt"):
        evaluate(tmp_path / "run", progress=False)
    with pytest.raises(CheckpointError, match="not a lenx run"):
        evaluate(tmp_path / "nowhere", progress=False)


# --- evaluation protocol --------------------------------------------------------------------------

def test_eval_windows_are_method_independent_and_nested(data_root):
    corpus = open_training_corpus(tiny(data_root))
    a, note = eval_windows(corpus, "test", 512, 8, seed=3)
    b, _ = eval_windows(corpus, "test", 512, 8, seed=3)
    assert a.shape == (8, 513) and np.array_equal(a, b) and "documents" in note


def test_last_tokens_scored_and_delta_p_arithmetic(data_root, tmp_path, monkeypatch):
    from lenx.evaluation import evaluate as ev

    train(tiny(data_root, "train.steps=3", "model.method=kerple"), tmp_path / "run", progress=False)
    seen = []
    real = ev.token_nll

    def spy(model, x, y, last):
        out = real(model, x, y, last)
        seen.append((x.shape[1], out.shape[1]))
        return out

    monkeypatch.setattr(ev, "token_nll", spy)
    r = evaluate(tmp_path / "run", lengths=[32, 64, 128], windows=4, scored=16, progress=False)
    assert (32, 32) in seen and (128, 128) in seen  # the whole window is read and scored per token
    res = r["results"]
    assert set(res) == {"32", "64", "128"} and "delta_p" not in res["32"]
    # With nested windows, the short-context reference equals the L = T_train run's last-T_train ppl.
    ref_ppl = res["32"]["ppl_full"]
    full_nll = ev._forward_nll(load_run(tmp_path / "run", torch.device("cpu"))[0],
                               eval_windows(open_training_corpus(tiny(data_root)), "test", 128, 4, 1234)[0],
                               128, 32, torch.device("cpu"), "fp32", 8192)
    # (abs tolerance: two forwards of the same input differ in the last float32 bits on CPU)
    assert res["128"]["delta_p"] == pytest.approx(ref_ppl - math.exp(full_nll.double().mean().item()), abs=2e-3)
    assert res["64"]["ppl"] > 0 and math.isfinite(res["64"]["ppl_full"])
    # per-window losses for bootstrap intervals: their mean is the reported NLL, one document each
    for row in res.values():
        assert len(row["window_nll"]) == 4 and math.isclose(sum(row["window_nll"]) / 4, row["nll"], rel_tol=1e-5)
    corpus = open_training_corpus(tiny(data_root))
    docs = corpus.docs("test")
    assert len(r["window_documents"]) == 4 and all(0 <= d < len(docs) for d in r["window_documents"])
    windows, _, documents = ev.eval_windows_with_documents(corpus, "test", 128, 4, 1234)
    tokens = np.asarray(corpus.tokens("test"))
    for window, d in zip(windows, documents):  # the window's last target lies inside its document
        start, length = docs[d]
        ends = [p + len(window) - 1 for p in range(len(tokens) - len(window) + 1)
                if tokens[p] == window[0] and np.array_equal(tokens[p:p + len(window)], window)]
        assert any(start <= e < start + length for e in ends)
    # Without L = T_train among the lengths the reference is computed separately: same DeltaP.
    r2 = evaluate(tmp_path / "run", lengths=[64, 128], windows=4, scored=16, progress=False, write=False)
    assert r2["results"]["128"]["delta_p"] == pytest.approx(res["128"]["delta_p"], abs=2e-3)


def test_lengths_shorter_than_scored_window_error(data_root, tmp_path):
    train(tiny(data_root, "train.steps=2"), tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="shorter than the 16 scored"):
        evaluate(tmp_path / "run", lengths=[8, 64], scored=16, progress=False)


# --- sweep, plots, CLI ----------------------------------------------------------------------------

def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def test_cli_end_to_end(data_root, tmp_path):
    sets = []
    for o in TINY + [f"data.root={str(data_root)!r}", "train.steps=4", "train.val_every=2", "train.val_batches=2"]:
        sets += ["--set", o]
    out = run_cli("sweep", "--methods", "rope,dapev2-kerple", "--no-progress", "-o", str(tmp_path / "sw"), *sets)
    assert out.returncode == 0, out.stderr
    results = json.loads((tmp_path / "sw" / "results.json").read_text())
    assert [r["method"] for r in results["runs"]] == ["rope", "dapev2-kerple"]
    assert [step for step, _ in results["val_curves"]["rope"]] == [2, 4] and results["curves"]["rope"]
    assert (tmp_path / "sw" / "results.md").read_text().count("|") > 10
    for png in ("perplexity.png", "delta_p.png", "loss.png"):
        (tmp_path / "sw" / png).unlink()
    out = run_cli("plot", str(tmp_path / "sw"))
    assert out.returncode == 0, out.stderr
    for png in ("perplexity.png", "delta_p.png", "loss.png"):
        assert (tmp_path / "sw" / png).stat().st_size > 10_000
    out = run_cli("plot", str(tmp_path / "sw" / "dapev2-kerple"), "--attention", "--length", "24")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "sw" / "dapev2-kerple" / "attention_L0_H0.png").stat().st_size > 10_000
    out = run_cli("eval", str(tmp_path / "sw" / "rope"), "--lengths", "32,64", "--no-progress")
    assert out.returncode == 0 and "64" in out.stdout, out.stderr


def test_cli_errors_are_one_line():
    for args, needle in ((["train", "--set", "model.method=kerpel"], "Did you mean kerple"),
                         (["train", "--set", "train.stpes=1"], "did you mean train.steps"),
                         (["eval", "no-such-run"], "not a lenx run"),
                         (["prepare", "tehc"], "tech")):
        out = run_cli(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert needle in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_every_subcommand_has_help():
    for cmd in ("list", "prepare", "train", "eval", "sweep", "plot", "demo", "che", "bench"):
        out = run_cli(cmd, "--help")
        assert out.returncode == 0 and "Usage" in out.stdout, cmd
