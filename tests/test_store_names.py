"""Model name grammar (Ollama §6.2), display form, path safety (SEC-04) and case lookup."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelhub.errors import InvalidNameError
from modelhub.store import (
    MEDIA_CONFIG,
    Layer,
    Manifest,
    ModelName,
    Store,
    parse_name,
)

VALID = [
    # raw, host, namespace, model, tag
    ("llama3", "registry.ollama.ai", "library", "llama3", "latest"),
    ("llama3.2:1b", "registry.ollama.ai", "library", "llama3.2", "1b"),
    ("user/m:q4", "registry.ollama.ai", "user", "m", "q4"),
    ("user/m", "registry.ollama.ai", "user", "m", "latest"),
    ("example.com/ns/m:v1", "example.com", "ns", "m", "v1"),
    ("localhost:5000/ns/m", "localhost:5000", "ns", "m", "latest"),
    ("localhost:5000/ns/m:v2", "localhost:5000", "ns", "m", "v2"),
    ("http://localhost:5000/ns/m:v2", "localhost:5000", "ns", "m", "v2"),
    ("https://example.com/ns/m", "example.com", "ns", "m", "latest"),
    ("HTTPS://example.com/ns/m", "example.com", "ns", "m", "latest"),
    ("  smollm2:135m \n", "registry.ollama.ai", "library", "smollm2", "135m"),
    ("_x/_y:_z", "registry.ollama.ai", "_x", "_y", "_z"),
    ("MyModel:Q4_K_M", "registry.ollama.ai", "library", "MyModel", "Q4_K_M"),
    ("a-b_c.d:1.0-rc_1", "registry.ollama.ai", "library", "a-b_c.d", "1.0-rc_1"),
    ("h/n/" + "m" * 80 + ":" + "t" * 80, "h", "n", "m" * 80, "t" * 80),
    ("h" * 350 + "/n/m", "h" * 350, "n", "m", "latest"),
    ("n" * 80 + "/m", "registry.ollama.ai", "n" * 80, "m", "latest"),
    ("con", "registry.ollama.ai", "library", "con", "latest"),  # fine on POSIX, as in Ollama
]

INVALID = [
    "",
    "   ",
    "a/b/c/d",  # host would contain '/'
    "my.ns/m",  # no '.' in a namespace
    "-m",
    "m:",
    ":tag",
    "/m",
    "m/",
    "ns//m",
    "../../x",
    "a/../../b",
    "..",
    ".",
    "./m",
    "x:..",
    "x:.hidden",
    "/abs/x",
    "C:\\x",
    "C:\\Windows\\x",
    "a\\b",
    "m" * 81,
    "m:" + "t" * 81,
    "n" * 81 + "/m",
    "h" * 351 + "/n/m",
    "x" * 300,
    "m@sha256:" + "0" * 64,
    "m:latest@sha256:" + "0" * 64,
    "ftp://host/ns/m",
    "http://",
    "with space",
    "tab\tname",
    "new\nline",
    "nul\x00byte",
    "ünïcode",
    "\u212aey",  # Kelvin sign: lowercases to ASCII 'k' but is not ASCII
    "m:tag:extra",
    "host:port:x/ns/m/extra",
    "~/m",
    "$HOME",
    "m;rm -rf",
]


@pytest.mark.parametrize(("raw", "host", "namespace", "model", "tag"), VALID)
def test_valid_names(raw: str, host: str, namespace: str, model: str, tag: str) -> None:
    assert parse_name(raw) == ModelName(host, namespace, model, tag)


@pytest.mark.parametrize("raw", INVALID)
def test_invalid_names(raw: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        parse_name(raw)
    assert str(info.value).startswith("invalid model name")
    assert info.value.status == 400


def test_invalid_name_message_says_what_is_wrong() -> None:
    with pytest.raises(InvalidNameError, match=r'invalid model name: "my.ns/m": the namespace'):
        parse_name("my.ns/m")
    with pytest.raises(InvalidNameError, match="at most 80"):
        parse_name("x" * 300)
    with pytest.raises(InvalidNameError, match="too many '/'"):
        parse_name("a/b/c/d")
    with pytest.raises(InvalidNameError, match="not supported"):
        parse_name("m@sha256:" + "0" * 64)


def test_message_escapes_control_characters() -> None:
    with pytest.raises(InvalidNameError) as info:
        parse_name("a\x1b[31mred")
    assert "\x1b" not in str(info.value)


@pytest.mark.parametrize(
    ("raw", "display"),
    [
        ("llama3", "llama3:latest"),
        ("llama3:8b", "llama3:8b"),
        ("user/m", "user/m:latest"),
        ("example.com/ns/m:v1", "example.com/ns/m:v1"),
        ("example.com/library/m", "example.com/library/m:latest"),
        ("REGISTRY.OLLAMA.AI/LIBRARY/m", "m:latest"),
        ("registry.ollama.ai/Library/m", "m:latest"),
        ("registry.ollama.ai/user/m:t", "user/m:t"),
        ("localhost:5000/ns/m", "localhost:5000/ns/m:latest"),
    ],
)
def test_display(raw: str, display: str) -> None:
    name = parse_name(raw)
    assert name.display == display
    assert str(name) == display
    # The short form parses back to the same name (up to the case of the default parts).
    assert parse_name(display).full.lower() == name.full.lower()


def test_full_and_relpath() -> None:
    name = parse_name("localhost:5000/ns/m:v1")
    assert name.full == "localhost:5000/ns/m:v1"
    assert name.manifest_relpath() == PurePosixPath("localhost:5000", "ns", "m", "v1")
    assert parse_name("m").full == "registry.ollama.ai/library/m:latest"


def test_from_parts_validates() -> None:
    assert ModelName.from_parts("h", "n", "m", "t") == ModelName("h", "n", "m", "t")
    for bad in [("..", "n", "m", "t"), ("h", "a.b", "m", "t"), ("h", "n", "m", ".tmp-x")]:
        with pytest.raises(InvalidNameError):
            ModelName.from_parts(*bad)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=120))
def test_any_text_parses_to_safe_parts_or_fails(raw: str) -> None:
    try:
        name = parse_name(raw)
    except InvalidNameError:
        return
    for part in (name.host, name.namespace, name.model, name.tag):
        assert part and part.isascii()
        assert "/" not in part and "\\" not in part and "\x00" not in part
        assert part not in (".", "..") and not part.startswith((".", "-"))
    assert len(name.manifest_relpath().parts) == 4


# ----- case-insensitive resolution against a real store -------------------------------------


def _commit(store: Store, raw_name: str, payload: bytes = b"{}") -> ModelName:
    digest, size = store.put_bytes(payload)
    name = parse_name(raw_name)
    store.write_manifest(name, Manifest(Layer(MEDIA_CONFIG, digest, size), []))
    return name


def test_resolve_returns_stored_spelling(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _commit(store, "Foo/Bar:Latest")
    for query in ["foo/bar:latest", "FOO/BAR:LATEST", "Foo/Bar:Latest", "fOo/bAr:lAtEsT"]:
        resolved = store.resolve(parse_name(query))
        assert resolved == ModelName("registry.ollama.ai", "Foo", "Bar", "Latest")
    assert store.get(parse_name("foo/bar:latest")).name.display == "Foo/Bar:Latest"
    assert store.resolve(parse_name("foo/bar:other")) is None
    assert store.resolve(parse_name("foo/baz")) is None


def test_resolve_default_host_case(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _commit(store, "llama3.2:latest")
    assert store.resolve(parse_name("REGISTRY.OLLAMA.AI/Library/LLAMA3.2:LATEST")) == parse_name(
        "llama3.2:latest"
    )


def test_foo_vs_foo_write_into_existing_spelling(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _commit(store, "MyModel:v1")
    _commit(store, "mymodel:v2")  # per part: lands in the existing MyModel directory
    model_dirs = list((tmp_path / "manifests" / "registry.ollama.ai" / "library").iterdir())
    assert [d.name for d in model_dirs] == ["MyModel"]
    assert sorted(m.name.display for m in store.list_models()) == ["MyModel:v1", "MyModel:v2"]
    _commit(store, "MYMODEL:V1", b'{"x":1}')  # overwrites v1, does not add a third tag
    assert len(store.list_models()) == 2


def test_exact_spelling_wins_over_other_case(tmp_path: Path) -> None:
    # Two case variants on disk (e.g. made by hand): an exact match is preferred.
    store = Store(tmp_path)
    _commit(store, "abc")
    lib = tmp_path / "manifests" / "registry.ollama.ai" / "library"
    (lib / "ABC").mkdir()
    (lib / "ABC" / "latest").write_bytes((lib / "abc" / "latest").read_bytes())
    assert store.resolve(parse_name("ABC")) == parse_name("ABC")
    assert store.resolve(parse_name("abc")) == parse_name("abc")
    assert store.resolve(parse_name("Abc")) in (parse_name("ABC"), parse_name("abc"))


def test_non_ascii_directory_never_matches(tmp_path: Path) -> None:
    store = Store(tmp_path)
    lib = tmp_path / "manifests" / "registry.ollama.ai" / "library"
    (lib / "\u212aey").mkdir(parents=True)  # KELVIN SIGN + "ey": lower() is "key"
    (lib / "\u212aey" / "latest").write_text("{}")
    assert store.resolve(parse_name("key")) is None
    _commit(store, "key")
    assert (lib / "key" / "latest").is_file()


@pytest.mark.parametrize(
    "parts",
    [("..", "n", "m", "t"), ("h", "n", "..", "t"), ("h", "n", "m", ""), ("h", "a/b", "m", "t")],
)
def test_direct_construction_is_validated_too(parts: tuple[str, str, str, str]) -> None:
    with pytest.raises(InvalidNameError):
        ModelName(*parts)
