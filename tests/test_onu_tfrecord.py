"""Tests of onu_tfrecord: framing counts, compression from the bytes, and Example parsing, against TensorFlow's own."""
import numpy as np
import pytest
import tensorflow as tf

from onu_lib import onu_tfrecord
from conftest import write_tfrecord

COMPRESSIONS = {'NONE': '', 'GZIP': 'GZIP', 'ZLIB': 'ZLIB'}


def _random_example(rng):
    """A tf.train.Example with every kind of feature, long and short, negative and large values."""
    example = tf.train.Example()
    feature = example.features.feature
    feature['image/encoded'].bytes_list.value.append(rng.bytes(int(rng.integers(0, 20000))))
    feature['image/class/label'].int64_list.value.append(int(rng.integers(-5, 1001)))
    feature['image/class/text'].bytes_list.value.append('tulipán 🌷'.encode())
    feature['image/object/bbox/xmin'].float_list.value.extend(rng.random(3).astype(np.float32).tolist())
    feature['big'].int64_list.value.extend([2 ** 62, -2 ** 62, 0])
    feature['empty'].bytes_list.value.extend([])
    return example


def _as_dict(example):
    """{key: (kind, values)} of a tf.train.Example, as TensorFlow's protobuf has it."""
    found = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof('kind')
        found[key] = (kind.split('_')[0] if kind else 'bytes', tuple(getattr(feature, kind).value) if kind else ())
    return found


@pytest.mark.parametrize('compression', sorted(COMPRESSIONS))
def test_compression_framing_and_examples_match_tensorflow(tmp_path, compression):
    rng = np.random.default_rng(1)
    examples = [_random_example(rng) for _ in range(40)]
    path = str(tmp_path / 'shard')
    write_tfrecord(path, [e.SerializeToString() for e in examples], COMPRESSIONS[compression])
    assert onu_tfrecord.sniff_compression(path) == compression
    assert onu_tfrecord.read_framing(path, compression) == onu_tfrecord.Framing(40, None)
    payloads = list(onu_tfrecord.read_records(path, compression))
    assert payloads == list(tf.compat.v1.io.tf_record_iterator(
        path, tf.io.TFRecordOptions(compression_type=COMPRESSIONS[compression])))
    for payload, example in zip(payloads, examples):
        parsed = onu_tfrecord.parse_example(payload)
        expected = _as_dict(example)
        assert set(parsed) == set(expected)
        for key, (kind, values) in expected.items():
            assert parsed[key].kind == kind
            np.testing.assert_array_equal(np.array(parsed[key].values, dtype=object if kind == 'bytes' else None),
                                          np.array(values, dtype=object if kind == 'bytes' else None))
    # The scan reads small values and skips the image bytes, keeping their lengths.
    for scanned, example in zip(onu_tfrecord.scan_examples(path, compression, max_bytes=100), examples):
        image = example.features.feature['image/encoded'].bytes_list.value[0]
        assert scanned['image/encoded'].values == ((len(image),) if len(image) > 100 else (image,))
        assert scanned['image/class/label'].values == tuple(example.features.feature['image/class/label']
                                                            .int64_list.value)


def test_counting_scales_by_seeking(tmp_path):
    path = str(tmp_path / 'big')
    write_tfrecord(path, [bytes(1 << 20)] * 30)  # 30 MB of payload: counting must not read it
    assert onu_tfrecord.read_framing(path, 'NONE').records == 30


@pytest.mark.parametrize('compression', sorted(COMPRESSIONS))
def test_a_cut_file_counts_its_complete_records_and_says_why(tmp_path, compression):
    path = str(tmp_path / 'shard')
    write_tfrecord(path, [b'x' * 10, b'', b'y' * 3000], COMPRESSIONS[compression])
    whole = open(path, 'rb').read()
    assert onu_tfrecord.count_records(path, compression) == 3
    with open(path, 'wb') as f:
        f.write(whole[:len(whole) - 5])
    framing = onu_tfrecord.read_framing(path, compression)
    assert framing.problem is not None
    assert framing.records == (2 if compression == 'NONE' else 3)  # compressed: the stream's end is what is cut
    if compression == 'NONE':
        # Cut inside the last record's data, inside its length header, and right after the second record.
        for cut, complete, problem in ((len(whole) - 5, 2, 'cut short: the file ends inside it'),
                                       (26 + 16 + 4, 2, 'inside its 12-byte header'), (26 + 16, 2, None),
                                       (7, 0, 'inside its 12-byte header')):
            with open(path, 'wb') as f:
                f.write(whole[:cut])
            framing = onu_tfrecord.read_framing(path, compression)
            assert framing.records == complete, cut
            assert (framing.problem is None) == (problem is None) and (problem or '') in (framing.problem or ''), cut


def test_a_flipped_length_byte_is_a_corrupted_header_not_a_wrong_count(tmp_path):
    path = str(tmp_path / 'shard')
    write_tfrecord(path, [b'a' * 100] * 3)
    data = bytearray(open(path, 'rb').read())
    data[100 + 16] ^= 0x01  # the second record's length
    open(path, 'wb').write(bytes(data))
    assert onu_tfrecord.read_framing(path, 'NONE') == onu_tfrecord.Framing(1, 'record 2 has a corrupted length header')


def test_files_that_are_not_tfrecords(tmp_path):
    (tmp_path / 'empty').write_bytes(b'')
    (tmp_path / 'text').write_text('label,path\n0,a.jpg\n')
    (tmp_path / 'jpeg').write_bytes(b'\xff\xd8\xff\xe0' + bytes(100))
    assert onu_tfrecord.sniff_compression(str(tmp_path / 'empty')) == 'NONE'  # an empty shard: no records
    assert onu_tfrecord.read_framing(str(tmp_path / 'empty'), 'NONE') == onu_tfrecord.Framing(0, None)
    assert onu_tfrecord.sniff_compression(str(tmp_path / 'text')) is None
    assert onu_tfrecord.sniff_compression(str(tmp_path / 'jpeg')) is None
    with pytest.raises(onu_tfrecord.NotAnExample):
        onu_tfrecord.parse_example(b'\x12\x05hello')  # field 2: not an Example's


def test_masked_crc32c_matches_tensorflows_framing(tmp_path):
    path = str(tmp_path / 'shard')
    write_tfrecord(path, [b'payload'])
    header = open(path, 'rb').read(12)
    assert onu_tfrecord.masked_crc32c(header[:8]) == int.from_bytes(header[8:], 'little')
