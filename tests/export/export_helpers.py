"""What the export tests share: writing any lenx model as an exported folder, and loading one as users do."""

from pathlib import Path


def write_model(lm, folder: Path, eos_id=None, train_len=32):
    """Write lenx model `lm` (float32) as an exported folder, as export_run does; returns the folder."""
    import lenx
    from lenx.export import hf
    from lenx.export.folder import AUTO_MAP, write_folder

    config = hf.config_for(lm.cfg, version=lenx.__version__, train_len=train_len, eos_id=eos_id, auto_map=AUTO_MAP)
    model = hf.LenxForCausalLM(config)
    model.model.load_state_dict(lm.state_dict())
    folder.mkdir(parents=True, exist_ok=True)
    write_folder(model, folder, None)
    return folder


def load(folder: Path, **kwargs):
    """The folder as users load it (kwargs: from_pretrained's, e.g. device_map)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **kwargs).eval()
