"""The documents of the lenx_text task (lenx_text.yaml): a few short paragraphs, held here so that
the task needs no download."""

PARAGRAPHS = [
    "The library opens at nine in the morning and closes at six in the evening. On Saturdays it closes at noon.",
    "A small boat crossed the lake before the wind rose. By the time it reached the far shore, the water was grey.",
    "To make the bread, mix the flour with warm water and a little salt, then leave the dough to rest for an hour.",
    "The train was late again, so she read another chapter of her book and watched the rain on the window.",
    "Every function in the module returns a new list; none of them changes the list it was given.",
    "He planted tomatoes along the south wall of the garden, where the sun stays longest in the afternoon.",
    "The meeting moved to Thursday because two of the speakers could not travel on Tuesday.",
    "When the river froze, the children from the village skated on it from morning until the light was gone.",
]


def load(**kwargs):
    """The task's dataset: one split, "test", of the paragraphs (kwargs: lm-eval's metadata, unused)."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": PARAGRAPHS})})
