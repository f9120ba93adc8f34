"""What `lenx list` prints: every method with the backends that run it, the layout presets, and every
CHE task."""

from .tables import Column, Table


def method_backends() -> list[dict]:
    """Per method (lenx.attention.all_methods order): its description and, for the CPU and for
    CUDA, the backends that run it, those that cannot train there last, marked "forward only"; on
    CUDA with how the backend picks its kernel where it depends on the work (DAPE V2)."""
    import torch

    from ..attention import Attention, AttentionConfig, all_methods
    from ..attention.backends import REGISTRY

    rows = []
    for name in all_methods():
        attn = Attention(AttentionConfig(method=name), 4, 64)
        backends = {}
        for dev in (torch.device("cpu"), torch.device("cuda")):
            ok = [b for b in REGISTRY if b.unsupported(attn.parts, dev) is None]
            how = {b.name: b.describe(attn.parts) for b in ok} if dev.type == "cuda" else {}
            backends[dev.type] = ([b.name + (f" ({how[b.name]})" if how.get(b.name) else "") for b in ok if b.trains(dev)]
                                  + [f"{b.name} (forward only)" for b in ok if not b.trains(dev)])
        rows.append({"method": name, "description": attn.spec.description, "backends": backends})
    return rows


def methods_table(methods: list[dict]) -> Table:
    """The method_backends() rows as a table."""
    table = Table("lenx methods: names read [processor-][normaliser-]base",
                  [Column("method", no_wrap=True)] + [Column(c) for c in ("description", "backends (CPU)",
                                                                          "backends (CUDA)")],
                  piped_width=140)  # descriptions and CUDA notes wrap: rows were 409 characters wide
    for m in methods:
        table.add_row(m["method"], m["description"], ", ".join(m["backends"]["cpu"]), ", ".join(m["backends"]["cuda"]))
    return table


def temperatures_table() -> Table:
    """The query temperatures (lenx.attention.methods.TEMPERATURES): a prefix on a method's name."""
    from ..attention.methods import TEMPERATURES

    table = Table("query temperatures: a prefix on a method's name (ssmax-rope, logn-kerple, ssmax-dapev2-kerple)",
                  [Column("prefix", no_wrap=True), Column("description")],
                  caption="n: the keys a query sees (its position + 1); L: the training length (model.temp_train_len). "
                          "Not on stick-breaking or CoPE (lenx says why)")
    for name, part in TEMPERATURES.items():
        table.add_row(name, part.description)
    return table


def layouts_table() -> Table:
    """The presets of model.layers (lenx.attention.layouts.PRESETS) with the layout each stands for."""
    from ..attention.layouts import PRESETS

    table = Table("layout presets for model.layers (or list each layer: method[:wW], N*(...) repeats)",
                  [Column("preset", no_wrap=True), Column("layers", no_wrap=True), Column("description")],
                  piped_width=140)
    for name, preset in PRESETS.items():
        table.add_row(name, preset.layers, preset.description)
    return table


def tasks_table(tasks: dict) -> Table:
    """CHE tasks ({name: task with .level and .chance}, lenx.tasks.TASKS) with their Chomsky level and chance."""
    table = Table("CHE tasks for `lenx che --tasks`",
                  [Column("task", no_wrap=True),  # a name cut short could not be typed back
                   Column("level"), Column("chance", "right")],
                  caption="level (Chomsky hierarchy): R regular, DCF deterministic context-free, CS "
                          "context-sensitive; chance: the accuracy of uniform guessing")
    for name, task in tasks.items():
        table.add_row(name, task.level, f"{task.chance:.3g}")
    return table
