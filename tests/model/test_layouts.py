"""Per-layer layouts (model.layers): the grammar and presets, the config each layer receives, the
checks before any work, T5's shared table in a mixed layout, the memory estimate, and KV-cache
decoding equal to the full forward (float64) for a mixed layout."""

import pytest
import torch

from helpers import V, assert_close, model_for
from lenx.attention.layouts import PRESETS, LayerSpec, LayoutError, parse_layout
from lenx.config import ConfigError, LMConfig, RunConfig
from lenx.model import LM, check_config

R, N = LayerSpec("rope"), LayerSpec("nope")


@pytest.mark.parametrize("text, n_layer, want", [
    ("rope:w4096,rope:w4096,rope:w4096,nope", 4, [LayerSpec("rope", 4096)] * 3 + [N]),
    ("3*(rope:w4096),nope", 8, ([LayerSpec("rope", 4096)] * 3 + [N]) * 2),  # repeated to n_layer
    (" 2*(alibi, 2*kerple:w8) , nope ", 7, [LayerSpec("alibi"), LayerSpec("kerple", 8), LayerSpec("kerple", 8)] * 2 + [N]),
    ("DAPEV2-Kerple:w3,sb", 2, [LayerSpec("dapev2-kerple", 3), LayerSpec("stickbreaking")]),  # canonical names
    ("rope", 3, [R] * 3),
    ("(2*(rope:w16),nope),alibi", 4, [LayerSpec("rope", 16)] * 2 + [N, LayerSpec("alibi")]),  # a bare group: once
    ("smollm3", 8, [R, R, R, N] * 2),
    ("rnope-swa", 4, [LayerSpec("rope", 4096)] * 3 + [N]),
    ("irope", 4, [LayerSpec("rope", 8192)] * 3 + [N]),
])
def test_the_grammar_and_the_presets(text, n_layer, want):
    assert parse_layout(text, n_layer) == want


def test_every_preset_is_a_layout_with_a_description():
    for name, preset in PRESETS.items():
        assert parse_layout(name, 4) == parse_layout(preset.layers, 4) and len(preset.description) > 20
    assert LMConfig().label == "rope" and LMConfig(layers=" SmolLM3 ").label == "smollm3"


@pytest.mark.parametrize("text, n_layer, needles", [
    ("rope,kerpel", 2, ["layer 1 (kerpel)", "unknown method", "kerple"]),
    ("rope,nope,rope:w0", 3, ["layer 2 (rope:w0)", "window must be >= 1"]),
    ("rope:w,nope", 2, ["layer 0 (rope:w)", "method:wW"]),
    ("2*(rope),dapev2-cope", 3, ["layer 2", "does not compose"]),
    ("rope,nope,nope", 4, ["pattern of 3 layers", "model.n_layer = 4"]),
    ("3*(rope", 3, ["never closed"]),
    ("rope,,nope", 2, ["character 6"]),
    ("rope)", 1, ["unexpected ')'"]),
    ("0*rope", 1, ["repeat count must be >= 1"]),
    ("10000000000*rope", 1, ["more than 65536 layers"]),  # refused before any list is made
    ("(" * 40 + "rope" + ")" * 40, 1, ["nested more than 16 deep"]),  # no RecursionError
    ("smollm", 4, ["'smollm3' is a preset"]),
    ("", 2, ["empty"]),
])
def test_a_bad_layout_is_one_line_naming_the_layer(text, n_layer, needles):
    with pytest.raises(LayoutError) as e:
        parse_layout(text, n_layer)
    message = str(e.value)
    assert "\n" not in message and all(n in message for n in needles), message


def test_each_layer_receives_its_own_config():
    cfg = LMConfig(n_layer=8, n_head=2, d_model=16, layers="3*(rope:w64),dapev2-kerple", rope_base=500.0)
    model = LM(cfg)
    got = [(b.attn.cfg.method, b.attn.cfg.window, b.attn.spec.name) for b in model.blocks]
    assert got == [("rope", 64, "rope")] * 3 + [("dapev2-kerple", 0, "dapev2-kerple")] + [("rope", 64, "rope")] * 3 \
        + [("dapev2-kerple", 0, "dapev2-kerple")]
    assert all(b.attn.cfg.rope_base == 500.0 and b.attn.cfg.d_model == 16 for b in model.blocks)  # the rest is cfg's
    assert [type(b.attn.rope).__name__ for b in model.blocks[:4]] == ["RoPE"] * 3 + ["NoneType"]
    assert model.blocks[3].attn.processor is not None and model.blocks[0].attn.processor is None
    assert model.layout()[:4] == [{"method": "rope", "window": 64}] * 3 + [{"method": "dapev2-kerple", "window": 0}]
    assert cfg.method == "rope" and cfg.window == 0  # the model's own config is left as it was
    plain = LM(LMConfig(n_layer=2, n_head=2, d_model=16, method="alibi"))  # no layout: model.method everywhere
    assert [b.attn.spec.name for b in plain.blocks] == ["alibi", "alibi"]


def test_t5_layers_of_a_mixed_layout_share_one_table():
    model = LM(LMConfig(n_layer=4, n_head=2, d_model=16, layers="t5,nope,t5,rope"))
    tables = [b.attn.bias for b in model.blocks]
    assert tables[0] is tables[2] and tables[1] is None and tables[3] is None
    names = [n for n, _ in model.named_parameters()]  # named once: trained once, saved once
    assert sum("relative_attention_bias" in n for n in names) == 1


@pytest.mark.parametrize("layers", ["t5,nope,t5,rope", "dapev2-kerple,rope,stickbreaking,cope"])
def test_the_memory_estimate_counts_each_layer_s_parameters(layers):
    from lenx.model import estimate_memory

    cfg = LMConfig(n_layer=4, n_head=2, d_model=16, vocab_size=V, layers=layers, dape_hidden=4, cope_npos=8)
    est = estimate_memory(cfg, 2, 32, torch.device("cpu"), precision="fp32")
    assert est.model == LM(cfg).num_params() * 16  # weights, gradients and AdamW's two moments, fp32
    assert "chunked" in est.backend or "dense" in est.backend or "," in est.backend


def config(**model) -> RunConfig:
    cfg = RunConfig()
    cfg.model = LMConfig(**({"n_layer": 4, "n_head": 2, "d_model": 16} | model))
    return cfg


@pytest.mark.parametrize("model, needles", [
    ({"layers": "rope,kerpel"}, ["model.layers: layer 1 (kerpel)"]),
    ({"layers": "rope,nope,alibi"}, ["pattern of 3 layers", "model.n_layer = 4"]),
    ({"layers": "rope:w8,nope", "window": 8}, ["model.window", "with model.layers"]),
    ({"layers": "alibi,nope", "rope_fraction": 0.5}, ["model.rope_fraction", "model.layers=alibi,nope has none"]),
    ({"layers": "2*(t5),alibi,rope", "backend": "flex"}, ["model.backend=flex", "layer 3: rope"]),
])
def test_check_config_refuses_a_bad_layout_in_one_line(model, needles):
    with pytest.raises(ConfigError) as e:
        check_config(config(**model))
    assert "\n" not in str(e.value) and all(n in str(e.value) for n in needles), str(e.value)


def test_a_layout_of_every_method_family_passes_the_checks():
    check_config(config(layers="rnope-swa"))
    check_config(config(layers="rope:w16,kerple,dapev2-kerple:w3,stickbreaking", rope_fraction=0.5))


LAYOUTS = ["rope,t5,dapev2-kerple,nope", "stickbreaking,cope,rope,t5"]


@pytest.mark.parametrize("layers", LAYOUTS)
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_decoding_a_layout_equals_the_full_forward(layers, fraction):
    """Every layer decodes with its own parts (DAPE V2's halo is the model's, from its one layer)."""
    model = model_for("rope", n_layer=4, layers=layers, rope_fraction=fraction)
    assert [b.attn.spec.name for b in model.blocks] == layers.split(",")
    T = 24
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)[0]
        cache = model.new_cache(2, T)
        steps = [model.prefill(idx[:, :5], cache)] + [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(5, T)]
        ref = [model(idx[:, :i + 1])[0][:, -1] for i in range(4, T)]
    for i, (got, want) in enumerate(zip(steps, ref)):
        assert_close(got, want, 1e-9, f"{layers} step {i}")
    assert_close(steps[-1], full[:, -1], 1e-9, layers)
    assert model.halo == (1 if "dapev2" in layers else 0)


def test_the_static_step_of_a_layout_equals_decode():
    """The fixed-shape step (the CUDA graph's) gives decode's logits for a layout too."""
    model = model_for("rope", n_layer=4, layers="rope,t5,dapev2-kerple,nope", rope_fraction=0.5)
    idx = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = model.new_cache(1, 16), model.new_cache(1, 16)
        model.prefill(idx[:, :6], a)
        model.prefill(idx[:, :6], b)
        for i in range(6, 12):
            want = model.decode(idx[:, i:i + 1], a)[:, 0]
            got = model.static_step(idx[:, i], b, torch.tensor(i))
            b.length = i + 1
            assert_close(got, want, 1e-9, f"static step {i}")


def test_rope_scaling_applies_to_a_layout_with_rope_layers():
    """--rope-scaling: refused for a layout without RoPE, applied to one with (its RoPE layers take it)."""
    from lenx.config import load_config
    from lenx.evaluation.evaluate import apply_rope_scaling, run_label

    with pytest.raises(ConfigError, match="alibi,nope has no RoPE"):
        apply_rope_scaling(load_config("tiny", ["model.layers=alibi,nope"]), "yarn", None)
    cfg = load_config("tiny", ["model.layers=nope,rope"])
    assert apply_rope_scaling(cfg, "yarn", None)["train_len"] == 64
    model = LM(cfg.model)
    assert model.blocks[0].attn.rope is None and model.blocks[1].attn.rope.scaling == "yarn"
    assert run_label(cfg) == "nope,rope+yarn fine-tuned"
