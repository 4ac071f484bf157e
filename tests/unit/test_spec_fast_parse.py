"""libyaml's parser under the spec reader (spec._FastComposer) reads every text it takes as
PyYAML's own parser does: the same nodes, tags, values and styles, the same start marks and
end indexes (what the reader keeps of the marks). What it does not take, or refuses, is read
by PyYAML, whose message is the one a user sees."""

import random
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from xhagent import spec
from xhagent.spec import SpecError, load_text

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted(
    p for d in ("configs", "tests", "packaging") for p in (ROOT / d).rglob("*.yaml") if p.is_file()
)
EDGES = [
    "a: 1\r\nb: [x, y]\r\n",
    "--- 'quoted'\n...\n---\nplain\n",
    "k: |\n  two\n  lines\n\nj: >-\n  folded\n  text\n",
    "# comment\nm: {a: 'é', b: \"x\\ty\", c: ~, d: 2026-11-29, e: 0x1f, f: 1e3}\n",
    "- - nested\n  - seq\n- {a: b}\n",
    "x: 'it''s'\ny: \"\\u00e9\\n\"\nz: plain # trailing\n",
    "é: ü\n" * 3,
    "a: &anchor 1\n",
    "   \n",
]
# the punctuation of YAML, for texts made at random: most are refused by one or both
ALPHABET = list("ab1.~ :-[]{},'\"#|>\n\r&*%@`\\é")


def tree(node):
    start = node.start_mark
    marks = (start.index, start.line, start.column, node.end_mark.index)
    if isinstance(node, yaml.ScalarNode):
        return ("s", node.tag, node.value, node.style, marks)
    if isinstance(node, yaml.SequenceNode):
        return ("q", node.tag, [tree(n) for n in node.value], marks)
    return ("m", node.tag, [(tree(k), tree(v)) for k, v in node.value], marks)


def reading(composer, text):
    """The nodes of every document, or None where the composer refuses or steps aside."""
    loader = composer(text, "t.yaml")
    try:
        out = []
        while loader.check_node():
            out.append(tree(loader.get_node()))
        return out
    except (yaml.YAMLError, SpecError, spec._NotAlike):
        return None
    finally:
        loader.dispose()


def fast_reading(text):
    return reading(spec._FastComposer, text) if spec._fast_ok(text) else None


def same_reading(text) -> bool:
    """Whatever the fast path takes, PyYAML reads alike; what load_text says of the text is
    what PyYAML's path says. True where the fast path took it."""
    fast = fast_reading(text)
    if fast is not None:
        assert reading(spec._Composer, text) == fast, text
    try:
        got = [(d.value, d.text, d.positions) for d in load_text(text, "t.yaml")]
    except SpecError as exc:
        got = str(exc)
    try:
        want = [
            (d.value, d.text, d.positions) for d in spec._compose(spec._Composer, text, "t.yaml")
        ]
    except SpecError as exc:
        want = str(exc)
    assert got == want, text
    return fast is not None


def test_libyaml_is_there():
    # the speed is the point: a PyYAML without libyaml leaves only its own parser
    assert spec.CParser is not None


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_file_of_the_project_is_read_alike(path):
    same_reading(path.read_text())


def test_the_corpus_is_there_and_mostly_fast():
    assert len(CORPUS) >= 10
    assert sum(fast_reading(p.read_text()) is not None for p in CORPUS) >= len(CORPUS) // 2


@pytest.mark.parametrize("text", EDGES)
def test_edge_texts_are_read_alike_on_the_fast_path(text):
    assert same_reading(text)


def test_random_texts_of_yaml_punctuation_are_read_alike():
    rng = random.Random(33)
    fast = 0
    for _ in range(20_000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 16)))
        fast += same_reading(text)
    assert fast >= 1000  # the fast path was taken, not only stepped around


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20),
)
data = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(data, st.sampled_from([None, True, False]), st.sampled_from([None, "'", '"', "|"]))
def test_dumped_data_is_read_alike(value, flow, style):
    same_reading(
        yaml.safe_dump(value, default_flow_style=flow, default_style=style, allow_unicode=True)
    )


def test_a_refusal_is_pyyamls_message():
    with pytest.raises(
        SpecError, match=r"^t.yaml:2:2: invalid YAML: expected ',' or ']', but got ':'$"
    ):
        load_text("a: [1, 2\nb: 3\n", "t.yaml")


def test_a_task_document_takes_the_fast_path(monkeypatch):
    def refuse(*args):
        raise AssertionError("PyYAML's parser was used")

    monkeypatch.setattr(spec, "_Composer", refuse)
    text = (ROOT / "configs/examples/task-infer.yaml").read_text()
    assert load_text(text, "t.yaml")[0].value["kind"] == "Task"
    assert load_text("é: ü\n", "t.yaml")[0].value == {"é": "ü"}


@pytest.mark.parametrize(
    "text",
    [
        "a: b\u2028c\n",
        "\ufeffa: 1\n",
        "a: \x85\n",
        "a: !!str 1\n",
        "a:\tb\n",
        "? a\n: b\n",
        "a: |#\n",
    ],
)
def test_what_the_two_may_read_apart_goes_to_pyyaml(text):
    assert not spec._fast_ok(text)


@pytest.mark.parametrize("text", ["a:\n", "---\n", "- \n- x\n", "{a: }\n"])
def test_an_empty_value_goes_to_pyyaml(text):
    assert spec._fast_ok(text) and fast_reading(text) is None
    same_reading(text)
