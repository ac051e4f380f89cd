"""Our GGUF reader (lazy metadata arrays) reads every field and tensor exactly as gguf's own reader does."""

import gguf
import numpy as np
import pytest

from prefill.costmodel.gguf_reader import array_values, reader_class


def same_as_gguf(path) -> int:
    """Compare every field (offset, types, data indices, parts, contents) and tensor; returns the field count."""
    theirs, ours = gguf.GGUFReader(str(path)), reader_class()(str(path))
    assert list(theirs.fields) == list(ours.fields)
    for name, a in theirs.fields.items():
        b = ours.fields[name]
        assert (a.offset, a.name, list(a.types), list(a.data)) == (b.offset, b.name, list(b.types), list(b.data))
        assert len(a.parts) == len(b.parts) and a.contents() == b.contents(), name
        ends = [*range(min(len(a.parts), 12)), *range(-min(len(a.parts), 3), 0)]
        for i in ends:
            assert a.parts[i].dtype == b.parts[i].dtype and a.parts[i].tobytes() == b.parts[i].tobytes(), (name, i)
        assert [p.tobytes() for p in a.parts[3:9]] == [p.tobytes() for p in b.parts[3:9]]  # slices too
        if a.types[0] == gguf.GGUFValueType.ARRAY:
            assert array_values(b) == array_values(a) == a.contents()  # at once (ours), one by one (gguf's)

    def table(r):
        return [(t.name, t.tensor_type, t.data_offset, tuple(t.shape), t.data.tobytes()[:64]) for t in r.tensors]

    assert table(theirs) == table(ours)
    return len(theirs.fields)


def test_every_kind_of_field_reads_the_same(tmp_path):
    path = tmp_path / "kinds.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("test.strings", ["a", "", "ünïcødé", "▁x" * 300])
    w.add_array("test.floats", [0.5, -1.25, 3.0])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.nested", [[1, 2], [3]])  # arrays of arrays: gguf's own path
    w.add_bool("test.bool", True)
    w.add_string("test.string", "hello")
    w.add_uint64("test.u64", 2**40)
    w.add_tensor("t.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert same_as_gguf(path) == 3 + 1 + 7  # GGUF.*, the architecture and the seven above


@pytest.mark.slow
def test_the_embedded_model_reads_the_same():
    from prefill.loading import default_model_path

    assert same_as_gguf(default_model_path()) > 30  # its 49,152-token vocabulary, scores and merges among them


def test_a_truncated_vocabulary_is_an_error(tmp_path):
    path = tmp_path / "cut.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(1000)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    path.write_bytes(path.read_bytes()[:5000])  # cut inside the array
    with pytest.raises(ValueError, match="past the end of the file"):
        reader_class()(str(path))
