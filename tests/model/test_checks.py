"""A run config's checks: lenx.config.validate ([train], [eval], [data], when a config is loaded),
lenx.model.check_config (every field's range or choices, with [model] against the attention
registries, and a build of the model on the meta device) and lenx.model.check_device (then what
depends on the machine)."""

from dataclasses import replace
from pathlib import Path
import re

import pytest
import torch

from lenx.attention import all_methods
from lenx.config import ConfigError, load_config
from lenx.model import check_config, check_device

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides, key", [
    (["model.method=dapev2-kerple", "model.dape_kernel=4"], "model.dape_kernel"),
    (["model.method=dapev2-kerple", "model.dape_kernel=0"], "model.dape_kernel"),
    ("model.n_head=0", "model.n_head"),
    ("model.n_head=3", "model.d_model (128) must be divisible by model.n_head (3)"),
    ("model.n_layer=0", "model.n_layer"),
    ("model.d_model=0", "model.d_model"),
    ("model.vocab_size=0", "model.vocab_size"),
    ("model.mlp_ratio=0", "model.mlp_ratio"),
    ("model.chunk_size=0", "model.chunk_size"),
    ("model.dropout=1.0", "model.dropout"),
    ("model.activation=swish", "model.activation"),
    ("model.sb_remainder=nowhere", "model.sb_remainder"),
    ("model.fire_activation=tanh", "model.fire_activation"),
    ("model.backend=fast", "model.backend"),
    (["model.method=kerple", "model.backend=sdpa"], "model.backend=sdpa"),  # sdpa runs no bias
    (["model.method=t5", "model.t5_buckets=1"], "model.t5_buckets"),
    (["model.method=t5", "model.t5_max_distance=8"], "model.t5_max_distance"),
    ("model.rope_base=0", "model.rope_base"),
    ("model.causal=false", "model.causal"),
    ("model.method=kerpel", "model.method"),
    ("train.lr=-1", "train.lr"),
    ("train.lr=nan", "train.lr"),
    ("train.grad_clip=0", "train.grad_clip"),
    ("train.warmup_frac=2", "train.warmup_frac"),
    ("train.min_lr_ratio=-0.5", "train.min_lr_ratio"),
    ("train.beta2=1", "train.beta2"),
    ("train.weight_decay=-1", "train.weight_decay"),
    ("train.seed=-1", "train.seed"),
    ("train.steps=0", "train.steps"),
    ("train.grad_accum=3", "train.batch_size (16) must be divisible by train.grad_accum (3)"),
    ("train.device=tpu", "train.device"),
    ("train.precision=fp8", "train.precision"),
    ("train.parallel=tp", "train.parallel"),
    ("train.val_every=-1", "train.val_every"),
    ("train.val_batches=0", "train.val_batches"),
    ("train.keep_every=-1", "train.keep_every"),
    ("eval.windows=0", "eval.windows"),
    ("eval.scored=-5", "eval.scored"),
    ("eval.max_length=0", "eval.max_length"),
    ("eval.lengths=[128, 0]", "eval.lengths"),
    ("eval.split='dev'", "eval.split"),
    ("eval.token_budget=-1", "eval.token_budget"),
    ("data.corpus=''", "data.corpus"),
])
def test_every_bad_value_names_its_key(overrides, key):
    with pytest.raises(ConfigError, match="^" + re.escape(key)):
        check_config(load_config("tiny", [overrides] if isinstance(overrides, str) else overrides))


def test_loading_checks_every_section_but_the_model():
    """lenx.config imports nothing from the model: [model] is check_config's."""
    with pytest.raises(ConfigError, match="^train.lr"):
        load_config("tiny", ["train.lr=-1"])
    cfg = load_config("tiny", ["model.method=kerpel"])
    with pytest.raises(ConfigError, match="^model.method"):
        check_config(cfg)


def test_new_train_fields_default_to_off():
    t = load_config("tiny").train
    assert (t.val_every, t.val_batches, t.keep_every) == (0, 8, 0)
    t = load_config("tiny", ["train.val_every=50", "train.val_batches=4", "train.keep_every=100"]).train
    assert (t.val_every, t.val_batches, t.keep_every) == (50, 4, 100)


def test_device_names():
    for name in ("auto", "cpu", "cuda", "cuda:0", "cuda:3"):
        load_config("tiny", [f"train.device='{name}'"])  # a name only: whether it exists is check_device's
    for name in ("tpu", "gpu", "cuda:", "cuda:x", "CPU"):
        with pytest.raises(ConfigError, match="train.device must be auto, cpu, cuda or cuda:N"):
            load_config("tiny", [f"train.device='{name}'"])


def test_every_method_builds_at_350m_on_the_meta_device(monkeypatch):
    """Validating the largest preset with every method builds each model on the meta device, where
    the weights take no memory (and so no time to initialise)."""
    from lenx.model import checks

    cfg, built = load_config("350m"), []
    real = checks._build_meta

    def recording(model_cfg):
        model = real(model_cfg)
        built.append({p.device.type for p in model.parameters()})
        return model

    monkeypatch.setattr(checks, "_build_meta", recording)
    for method in all_methods():
        check_config(replace(cfg, model=replace(cfg.model, method=method)))
    assert len(built) >= len(all_methods()) and all(devices == {"meta"} for devices in built)


def test_validation_leaves_the_random_state_alone():
    state = torch.get_rng_state()
    check_config(load_config("small", ["model.method=dapev2-t5"]))  # T5 is built on the CPU, not on meta
    assert torch.equal(torch.get_rng_state(), state)


def test_every_saved_run_config_still_loads():
    """Run configs written by earlier versions (results/) load under today's validation."""
    paths = sorted(ROOT.glob("results/**/config.toml"))
    assert paths
    for path in paths:
        check_config(load_config(path))


def test_check_device_judges_the_machine():
    triton = load_config("tiny", ["model.method=dapev2-kerple", "model.backend=triton"])
    flex = load_config("tiny", ["model.method=kerple", "model.backend=flex"])
    expected = r"model.backend=triton \(model.method=dapev2-kerple\) on cpu: .*Usable here: chunked, dense"
    with pytest.raises(ConfigError, match=expected):
        check_device(triton, "cpu")
    with pytest.raises(ConfigError, match="cannot train on cpu"):
        check_device(flex, "cpu")
    assert check_device(flex, "cpu", training=False) == torch.device("cpu")  # evaluation runs forward only
    with pytest.raises(ConfigError, match="--device must be"):
        check_device(flex, "tpu", key="--device")
    with pytest.raises(ConfigError, match="--device is cuda:99"):
        check_device(flex, "cuda:99", key="--device")
