"""FoX's Pro switches in a run config: booleans, and for the fox methods only, judged before any work
(one-line ConfigErrors that name the key)."""

from dataclasses import replace

import pytest

from lenx.config import ConfigError, load_config
from lenx.model import check_config

SWITCHES = ["fox_output_gate", "fox_qk_norm", "fox_kv_shift", "fox_output_norm"]


@pytest.mark.parametrize("switch", SWITCHES)
def test_a_switch_needs_a_fox_method(switch):
    cfg = load_config("tiny", [f"model.{switch}=true", "model.method='dapev2-fox'"])
    check_config(cfg)  # every fox composition takes it
    check_config(replace(cfg, model=replace(cfg.model, method="stickbreaking-fox")))
    with pytest.raises(ConfigError) as e:
        check_config(replace(cfg, model=replace(cfg.model, method="dapev2-kerple")))
    msg = str(e.value)
    assert msg.startswith(f"model.{switch} ") and "fox method" in msg and "dapev2-kerple" in msg and "\n" not in msg


def test_a_switch_is_a_boolean_and_off_by_default():
    cfg = load_config("tiny", ["model.method='fox'"])
    assert not any(getattr(cfg.model, s) for s in SWITCHES)
    with pytest.raises(ConfigError, match="model.fox_kv_shift must be true or false"):
        load_config("tiny", ["model.method='fox'", "model.fox_kv_shift=1"])
