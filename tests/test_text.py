"""The text data sets (Debian's fortune cookies): tokenised once on the host, deterministically,
into files a numpy-only runner reads; language-modelling and topic batches; the plan's refusals
(harness/preparation/text.py, workloads/datasets.py, harness/preparation/artifacts.py)."""
import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer

from harness.preparation import artifacts
from harness.planning import inventory, plan, suites
from harness.preparation.bundle import bundle_files
from harness.errors import UserError
from workloads import datasets
from harness.preparation import text
from workloads.spec import Hyper, Workload

from testkit.runners import checked
from testkit.tools import require

SUITE = SimpleNamespace(path="suite.toml")


@pytest.fixture(scope="module")
def made() -> artifacts.DataFiles:
    """The token files in this machine's cache (made here if they are not there yet)."""
    require("fortunes")
    return artifacts.raw_idx("fortunes", "")


def contents(r: artifacts.DataFiles) -> dict[str, bytes]:
    return {rel: p.read_bytes() for rel, p in r.files.items()}


def stored_entries(split: str) -> list[tuple[int, str]]:
    """A split's (topic, text) in the order the files store them, worked out here from the corpus."""
    _, corpus = text.read_corpus({f: f.read_bytes() for f in datasets.topic_files()})
    entries = text.split_entries(corpus)[split]
    return [entries[j] for j in text.stored_order(split, len(entries))]


def test_made_once_into_a_folder_named_by_its_sources_and_the_same_bytes_every_time(made, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))      # an empty cache: the files are made again
    again = artifacts.raw_idx("fortunes-topics", "")
    assert again.dir.name == made.dir.name and again.dir.parent == artifacts.root() / artifacts.DATA
    assert contents(again) == contents(made)
    assert sorted(again.files) == sorted(f"fortunes/{n}" for n in (
        "train-tokens-idx1-int", "train-entries-idx2-int", "train-labels-idx1-ubyte", "t10k-tokens-idx1-int",
        "t10k-entries-idx2-int", "t10k-labels-idx1-ubyte", "tokenizer.json", "manifest.json"))
    monkeypatch.setattr(text, "tokenise", lambda sources: pytest.fail("tokenised again"))
    assert artifacts.raw_idx("fortunes", "") == again                   # made once
    monkeypatch.setattr(artifacts, "TEXT_CODE", artifacts.Path(text.__file__).with_name("pointclouds.py"))
    with pytest.raises(pytest.fail.Exception, match="tokenised again"):  # other code: another folder
        artifacts.raw_idx("fortunes", "")


def test_the_manifest_and_the_tokenizer_decode_every_test_entry_back_to_its_text(made):
    m = json.loads(made.files["fortunes/manifest.json"].read_text())
    assert m["topics"] == [f.name for f in datasets.topic_files()] and m["vocab"] == 4096
    tok = Tokenizer.from_file(str(made.files["fortunes/tokenizer.json"]))
    assert tok.get_vocab_size() == m["vocab"] and tok.token_to_id(text.EOT) == m["eot"] == m["pad"]
    stream = datasets.read_idx(made.files["fortunes/t10k-tokens-idx1-int"], 0x0C)
    spans = datasets.read_idx(made.files["fortunes/t10k-entries-idx2-int"], 0x0C)
    entries = stored_entries("test")
    assert len(spans) == len(entries) == m["entries"]["test"] and len(stream) == m["tokens"]["test"]
    for (start, count), (_, want) in zip(spans, entries):
        assert tok.decode(stream[start:start + count].tolist()) == want
        assert stream[start + count] == m["eot"] and m["eot"] not in stream[start:start + count]


def test_language_modelling_targets_are_the_inputs_shifted_by_one(made):
    T, d = 32, str(made.dir)
    train = datasets.load("fortunes", "train", 0, d, context=T)
    stream = datasets.read_idx(made.files["fortunes/train-tokens-idx1-int"], 0x0C)
    assert len(train) == (len(stream) - 1) // T == datasets.split_size("fortunes", "train", d, T)
    idx = np.array([0, 5, len(train) - 1])
    x, y = train.batch(idx)
    assert x.shape == y.shape == (3, T) and x.dtype == y.dtype == np.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    np.testing.assert_array_equal(x, stream[idx[:, None] * T + np.arange(T)])
    np.testing.assert_array_equal(y[:, -1], stream[(idx + 1) * T])
    few = datasets.load("fortunes", "test", 10, d, context=T)
    assert len(few) == 10 and len(few.tokens) == 10 * T + 1           # only the tokens it spans are read
    with pytest.raises(datasets.DatasetError, match="its samples are sequences of tokens"):
        datasets.load("fortunes", "test", 0, d)


def test_topics_are_the_fortune_files_and_short_entries_are_left_padded(made):
    T, d = 48, str(made.dir)
    m = datasets.manifest("fortunes-topics", d)
    assert datasets.classes("fortunes-topics", d) == len(m["topics"]) >= 40 and datasets.classes("fortunes") == 0
    test = datasets.load("fortunes-topics", "test", 0, d, context=T)
    entries = stored_entries("test")
    x, y = test.batch(np.arange(len(test)))
    assert x.shape == (len(entries), T) and x.dtype == np.int32 and y.dtype == np.int64
    np.testing.assert_array_equal(y, [topic for topic, _ in entries])
    assert len(set(y[:100].tolist())) > 20                             # stored shuffled: a prefix holds many topics
    corpus = {f.name: f.read_text() for f in datasets.topic_files()}
    assert all(want in corpus[m["topics"][label]] for label, (_, want) in zip(y, entries))
    tok = Tokenizer.from_file(str(made.files["fortunes/tokenizer.json"]))
    counts = test.entries[:, 1]
    short, long = int(np.argmax(counts < T // 2)), int(np.argmax(counts > T))
    n = counts[short]
    assert (x[short, :T - n] == m["pad"]).all() and tok.decode(x[short, T - n:].tolist()) == entries[short][1]
    end = test.entries[long, 0] + counts[long]
    np.testing.assert_array_equal(x[long], test.tokens[end - T:end])       # a long entry's last T tokens
    assert datasets.split_size("fortunes-topics", "test", d) == len(entries)
    assert len(datasets.load("fortunes-topics", "train", 7, d, context=T)) == 7


def check(dataset: str, model: str, **hyper) -> None:
    checked(Workload(model=model, dataset=dataset), hyper)


def test_the_plan_gives_text_to_transformers_only_and_their_classes_from_the_topics(made):
    with pytest.raises(UserError, match="suite.toml: workload.dataset: fashion-mnist holds images, but "
                                        "workload.model gpt2-1m takes text"):
        check("fashion-mnist", "gpt2-1m")
    with pytest.raises(UserError, match="suite.toml: workload.dataset: fortunes holds text, but workload.model "
                                        "lenet5 takes images"):
        check("fortunes", "lenet5")
    with pytest.raises(UserError, match="fortunes-topics holds text, but workload.model pointnet takes point clouds"):
        check("fortunes-topics", "pointnet")
    size = datasets.split_size("fortunes", "train", str(made.dir), 256)
    check("fortunes", "gpt2-1m", train_samples=size)
    with pytest.raises(UserError, match=f"hyper.train_samples: expected at most the {size} sequences of 256 "
                                        "tokens of fortunes train"):
        check("fortunes", "gpt2-1m", train_samples=size + 1)
    with pytest.raises(UserError, match="hyper.test_samples: expected at most the 1521 samples"):
        check("fortunes-topics", "gpt2-1m", test_samples=1522)
    with pytest.raises(UserError, match="workload.rotate = 30: only the images of .* not fortunes"):
        plan.check_data(SUITE, Workload(model="gpt2-1m", dataset="fortunes", rotate=30.0), Hyper(), {})
    s = suites.load("quick")
    for dataset, classes in (("fortunes-topics", datasets.classes("fortunes-topics", str(made.dir))), ("fortunes", 0)):
        s.workload = {"model": "gpt2-1m", "dataset": dataset}
        jobs, _ = plan.make(s, inventory.resolve(["local"], None), runtimes=["torch"], precisions=["fp32"],
                            methods=["full-bp"], overrides={"train_samples": 64, "test_samples": 32})
        assert [j.spec["workload"]["architecture"]["classes"] for j in jobs] == [classes]


BOARD_READS = """
import json, sys
sys.modules["torch"] = sys.modules["tokenizers"] = None     # a board has neither
sys.path.insert(0, sys.argv[1])
import numpy as np
from workloads import datasets
out = {}
for name in ("fortunes", "fortunes-topics"):
    split = datasets.load(name, "test", 8, f"{sys.argv[1]}/data/{name}", context=16)
    x, y = split.batch(np.arange(8))
    out[name] = [x.tolist(), y.tolist(), str(y.dtype)]
print(json.dumps(out))
"""


def test_a_board_gets_the_files_by_hash_and_reads_them_with_numpy_alone(made, tmp_path):
    files = bundle_files({("fortunes", "", 0.0, 0, 0), ("fortunes-topics", "", 0.0, 0, 0)})
    for name in ("fortunes", "fortunes-topics"):
        for rel, p in made.files.items():
            assert files[f"data/{name}/{rel}"] == p
    board = tmp_path / "bundle"
    for rel, p in files.items():
        (board / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, board / rel)
    read = json.loads(subprocess.run([sys.executable, "-c", BOARD_READS, str(board)], capture_output=True, text=True,
                                     check=True, timeout=60).stdout)
    for name, dtype in (("fortunes", "int32"), ("fortunes-topics", "int64")):
        x, y = datasets.load(name, "test", 8, str(made.dir), context=16).batch(np.arange(8))
        assert read[name] == [x.tolist(), y.tolist(), dtype]


def test_planning_a_text_suite_makes_nothing(tmp_path, monkeypatch):
    """The plan decides and checks what it can without making anything: with an empty cache,
    planning a transformer on fortunes-topics (its head sized from the corpus's topics) writes
    no file; preparation makes the set (and then checks its sizes, test above)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(text, "tokenise", lambda sources: pytest.fail("planning tokenised the corpus"))
    s = suites.load("quick")
    s.workload = {"model": "gpt2-1m", "dataset": "fortunes-topics"}
    jobs, _ = plan.make(s, inventory.resolve(["local"], None), runtimes=["torch"], precisions=["fp32"],
                        methods=["full-bp"], overrides={"train_samples": 64, "test_samples": 32})
    assert [j.spec["workload"]["architecture"]["classes"] for j in jobs] == [len(datasets.topic_files())]
    assert not artifacts.root().exists() or list(artifacts.root().rglob("*")) == []
