"""builder.matrix.grammar: each grammar accepts its real values unchanged and refuses hostile ones with
one line saying what it expects."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builder.matrix import grammar
from builder.matrix.grammar import GrammarError

HOSTILE = ["\n", "\r", ";", "&&", "$(id)", "`id`", '"', "'", "\\", "\u2028", "\u2029", "\x85",
           "\x00", " ", "\t", "|", "#"]

GOOD = {
    grammar.oci_reference: [
        "nvidia/cuda:13.0.2-base-ubuntu24.04", "ubuntu", "localhost:5000/a/b:c",
        "rocm/verl:verl-0.7.1.amd0_rocm7.0.2_ubuntu22.04_py3.12_vllm0.20.2",
        "nvidia/cuda:13.0.2-base-ubuntu24.04@sha256:" + "a" * 64,
        "registry.example.org/team/img@sha256:" + "0123456789abcdef" * 4,
        "[::1]:5000/x:y",
    ],
    grammar.debian_package: ["libibverbs1", "ibverbs-providers", "g++", "libstdc++6",
                             "libnuma1:arm64", "curl=8.5.0-2ubuntu10.6", "tzdata=1:2024a-1"],
    grammar.pep440_version: ["2.11.0", "1.0rc1", "2.9.1.dev20251204+rocm7.0.2", "0.20.2rc1",
                             "2.11.0+cu130"],
    grammar.pep508_requirement: ["torch==2.11.0", "ray[default]==2.60.0",
                                 "foo>=1; python_version < \"3.13\"",
                                 "tensordict @ https://mirror/t.tar.gz"],
    grammar.url: ["https://mirror.example/simple", "http://10.0.0.1:8080/x?y=1&z=2"],
    grammar.path: ["/srv/src/tensordict-v0.10.0", "certs/ca.pem", "a b/c"],
    grammar.env_name: ["PIP_INDEX_URL", "_x", "A1"],
    grammar.plain: ["NVIDIA x86_64 (H100/H200/B200), CUDA 13.0", "", "ünïcode ok"],
}

BAD = {
    grammar.oci_reference: [
        "nvidia/cuda:13.0.2-base-ubuntu24.04\nRUN echo pwned", "nvidia/Cuda", "a:b:c",
        "ubuntu:" + "x" * 129, "ubuntu@sha256:abc", "ubuntu@sha256:" + "A" * 64, "",
        "ubuntu latest", "ubuntu:$(id)", "a" * 256,
    ],
    grammar.debian_package: ["curl; rm -rf /", "Curl", "c", "-x", "curl=", "curl/noble",
                             "curl && id", ""],
    grammar.pep440_version: ["2.11.0\n", " 2.11.0", "2.11.0; id", "latest", ""],
    grammar.pep508_requirement: ["torch==2.11.0\nRUN id", "torch ==", "", " torch"],
    grammar.url: ["ftp://x/y", "https://", "https://x/\ny", "https://x/a b", "https://x/`id`",
                  "https://x/\"", "x/y", "https://x\\y", ""],
    grammar.path: ["", "a\nb", "a\x00b", "a\u2028b", "a\x85b", "a\rb"],
    grammar.env_name: ["1A", "A-B", "A B", "", "A\n", "É"],
    grammar.plain: ["a\nb", "a\u2029b", "a\x1bb", "\u202e"],
}


@pytest.mark.parametrize("fn,value", [(f, v) for f, vs in GOOD.items() for v in vs])
def test_good_values_are_returned_unchanged(fn, value):
    assert fn(value) is value


@pytest.mark.parametrize("fn,value", [(f, v) for f, vs in BAD.items() for v in vs])
def test_bad_values_are_refused_in_one_line(fn, value):
    with pytest.raises(GrammarError) as info:
        fn(value)
    message = str(info.value)
    assert "\n" not in message and "\u2028" not in message and "\x85" not in message
    assert "expected" in message.lower() or "character" in message or "whitespace" in message


def test_grammar_error_is_a_value_error():
    assert issubclass(GrammarError, ValueError)


@pytest.mark.parametrize("fn", list(GOOD))
def test_non_strings_are_refused(fn):
    with pytest.raises(GrammarError, match="expected a string"):
        fn(3)


def test_url_schemes_are_the_callers():
    assert grammar.url("git+https://h/x", schemes=("git+https",)) == "git+https://h/x"
    with pytest.raises(GrammarError, match="scheme"):
        grammar.url("https://h/x", schemes=("git+https",))


def test_oci_digest():
    digest = "sha256:" + "0123456789abcdef" * 4
    assert grammar.oci_digest(digest) is digest
    for bad in ("sha256:" + "a" * 63, "sha256:" + "A" * 64, "md5", "sha256:" + "a" * 64 + "\n"):
        with pytest.raises(GrammarError):
            grammar.oci_digest(bad)


def test_parse_oci_reference_splits_name_tag_digest():
    digest = "sha256:" + "b" * 64
    ref = grammar.parse_oci_reference(f"nvidia/cuda:13.0.2-base-ubuntu24.04@{digest}")
    assert ref == ("nvidia/cuda", "13.0.2-base-ubuntu24.04", digest)
    assert grammar.parse_oci_reference("localhost:5000/x") == ("localhost:5000/x", None, None)
    assert grammar.parse_oci_reference("ubuntu:24.04") == ("ubuntu", "24.04", None)


# --- properties: any value carrying a hostile character is refused ----------------------------

STRUCTURAL = ["\n", "\r", "\u2028", "\u2029", "\x85", "\x00", "\x0b", "\x0c"]
_line_breakers = st.sampled_from(STRUCTURAL)
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=20)


@settings(max_examples=60, deadline=None, database=None)
@given(prefix=_text, bad=_line_breakers, suffix=_text,
       fn=st.sampled_from([*GOOD, grammar.oci_digest]))
def test_no_grammar_accepts_a_line_break(prefix, bad, suffix, fn):
    with pytest.raises(GrammarError):
        fn(prefix + bad + suffix)


@settings(max_examples=60, deadline=None, database=None)
@given(good=st.sampled_from(GOOD[grammar.debian_package] + GOOD[grammar.oci_reference]
                            + GOOD[grammar.env_name] + GOOD[grammar.pep440_version]),
       bad=st.sampled_from(HOSTILE))
def test_shell_metacharacters_never_pass_the_token_grammars(good, bad):
    for fn in (grammar.debian_package, grammar.oci_reference, grammar.env_name,
               grammar.pep440_version):
        for value in (good + bad, bad + good, good + bad + "x"):
            with pytest.raises(GrammarError):
                fn(value)
