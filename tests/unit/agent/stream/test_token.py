"""The projected ServiceAccount token file, re-read when the kubelet rotates it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuhealth.agent.stream.token import TokenFile
from gpuhealth.common.errors import TransientError


def test_token_file_rereads_on_rotation(tmp_path: Path) -> None:
    p = tmp_path / "token"
    p.write_text("one\n")
    tf = TokenFile(p)
    assert tf.get() == "one"
    assert tf.get() == "one"
    assert tf.reads == 1
    tmp = tmp_path / "token.new"
    tmp.write_text("two-rotated")
    os.replace(tmp, p)  # the kubelet swaps atomically
    assert tf.get() == "two-rotated"
    assert tf.reads == 2
    p.write_text("")
    with pytest.raises(TransientError):
        tf.get()
    p.unlink()
    with pytest.raises(TransientError):
        tf.get()
