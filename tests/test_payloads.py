"""The shared directory's audio files: mapped by the worker, never changed through the mapping."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

from pipeline.serving.payloads import PCM16, PCM16_FILE, Payloads, pcm16_bytes


def _wave(n: int = 1600) -> torch.Tensor:
    return torch.randint(-32768, 32768, (n,)).float() / 32768


def test_a_shared_audio_file_is_read_back_exactly_and_writing_the_tensor_leaves_the_file(tmp_path):
    p = Payloads(tmp_path / "shm")
    jid, wave = str(uuid.uuid4()), _wave()
    value = p.audio(jid, 0, wave)
    path = tmp_path / "shm" / "audio" / jid / "0"
    assert path.read_bytes()[:2] == PCM16_FILE  # samples 2-byte aligned after the header
    got = p.read_audio(value)
    assert got.dtype == torch.int16 and torch.equal(got.float() / 32768, wave)
    before = path.read_bytes()
    got.zero_()  # a private mapping: the tensor is writable, the file is not written
    assert path.read_bytes() == before
    path.unlink()  # the job ended meanwhile: a mapping already made keeps its samples
    assert p.read_audio(value) is None


def test_a_mapping_outlives_the_deleted_file(tmp_path):
    p = Payloads(tmp_path / "shm")
    jid, wave = str(uuid.uuid4()), _wave()
    got = p.read_audio(p.audio(jid, 0, wave))
    p.delete_audio_now([jid])
    assert not (tmp_path / "shm" / "audio" / jid).exists()
    assert torch.equal(got.float() / 32768, wave)


def test_an_older_writers_file_is_read_too(tmp_path):
    p = Payloads(tmp_path / "shm")
    jid, wave = str(uuid.uuid4()), _wave(801)
    path = tmp_path / "shm" / "audio" / jid / "0"
    path.parent.mkdir()
    path.write_bytes(PCM16 + pcm16_bytes(wave))  # b"S" + PCM: the samples at an odd offset
    got = p.read_audio(b"F" + f"audio/{jid}/0".encode())
    assert torch.equal(got.float() / 32768, wave)


@pytest.mark.parametrize("content", [b"", b"P", b"X\0\1\2"])
def test_a_damaged_file_is_refused_with_its_reason(tmp_path, content):
    p = Payloads(tmp_path / "shm")
    jid = str(uuid.uuid4())
    path = tmp_path / "shm" / "audio" / jid / "0"
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(ValueError, match="shared audio file too short|unknown format"):
        p.read_audio(b"F" + f"audio/{jid}/0".encode())


def test_inline_values_are_unchanged():
    p = Payloads(None)
    wave = _wave()
    value = p.audio(str(uuid.uuid4()), 0, wave)
    assert value[:1] == PCM16 and len(value) == 1 + 2 * wave.numel()
    assert np.array_equal(p.read_audio(value).numpy(), np.rint(wave.numpy() * 32768).astype(np.int16))
