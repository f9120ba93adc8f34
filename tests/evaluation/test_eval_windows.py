"""Evaluation windows come from distinct held-out documents."""

import numpy as np


class _Stream:
    """A corpus split of documents with the given lengths whose tokens are their positions."""

    def __init__(self, lengths):
        lengths = np.asarray(lengths, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths[:-1] + 1)])
        self._docs = np.stack([starts, lengths], 1)
        self._tokens = np.arange(starts[-1] + lengths[-1] + 1, dtype=np.uint16)

    def tokens(self, split):
        return self._tokens

    def docs(self, split):
        return self._docs


def _old_window_starts(docs, need, count, seed):
    """How windows were drawn before they were made distinct: documents with replacement."""
    rng = np.random.default_rng(seed)
    long_docs = docs[docs[:, 1] >= need]
    picks = long_docs[rng.integers(0, len(long_docs), size=count)]
    return picks[:, 0] + (rng.random(count) * (picks[:, 1] - need + 1)).astype(np.int64)


def test_eval_windows_come_from_distinct_documents_when_there_are_enough():
    from lenx.evaluation.evaluate import eval_windows_with_documents

    split = _Stream([40] * 20 + [300] * 200)  # 200 documents hold a window of 200 tokens (+1)
    docs = split.docs("test")
    changed = kept = 0
    for seed in range(20):
        windows, note, documents = eval_windows_with_documents(split, "test", 200, 16, seed)
        old = _old_window_starts(docs, 201, 16, seed)
        old_docs = np.searchsorted(docs[:, 0], old, side="right") - 1
        assert len(set(documents)) == 16 and "from 16 held-out documents" in note
        assert (docs[documents, 1] == 300).all()
        starts = windows[:, 0].astype(np.int64)
        assert (windows == starts[:, None] + np.arange(201)).all()  # each window whole, in its document
        assert ((starts >= docs[documents, 0]) & (starts + 201 <= docs[documents].sum(1))).all()
        if len(set(old_docs)) == 16:
            assert (starts == old).all()  # already distinct: the very same windows
            kept += 1
        else:
            first = [i for i in range(16) if old_docs[i] not in old_docs[:i]]
            assert (starts[first] == old[first]).all()  # a document's first window stays
            changed += 1
        again = eval_windows_with_documents(split, "test", 200, 16, seed)
        assert (again[0] == windows).all() and (again[2] == documents).all()
    assert changed and kept
    # Fewer long documents than windows: drawn as before, with repeats.
    few = _Stream([40] * 20 + [300] * 10)
    for seed in range(5):
        windows, _, documents = eval_windows_with_documents(few, "test", 200, 16, seed)
        assert (windows[:, 0] == _old_window_starts(few.docs("test"), 201, 16, seed)).all()


def test_windows_of_a_sharded_train_split_are_those_of_the_whole_file(tmp_path):
    """eval.split=train, and retrieval's filler, read a sharded train split (lenx shard) through its
    view: the same windows as from train.bin."""
    from lenx.data import open_corpus
    from lenx.data.build import prepare_corpus
    from lenx.data.sharding import shard_corpus
    from lenx.evaluation.evaluate import eval_windows_with_documents
    from lenx.evaluation.retrieval import copy_inputs

    prepare_corpus("synthetic", tmp_path, progress=False)
    whole = open_corpus("synthetic", tmp_path)
    before = eval_windows_with_documents(whole, "train", 4096, 8, seed=3)
    copies = copy_inputs(whole, "train", 256, 0.5, 4, seed=3)
    shard_corpus("synthetic", tmp_path, "50K", remove_bin=True)
    sharded = open_corpus("synthetic", tmp_path)
    after = eval_windows_with_documents(sharded, "train", 4096, 8, seed=3)
    assert np.array_equal(before[0], after[0]) and before[1] == after[1] and np.array_equal(before[2], after[2])
    for a, b in zip(copies, copy_inputs(sharded, "train", 256, 0.5, 4, seed=3)):
        assert np.array_equal(a["input"], b["input"]) and np.array_equal(a["targets"], b["targets"])
