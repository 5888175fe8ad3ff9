"""Tests of onu_tfrecord: framing counts, payload CRCs, compression from the bytes, and Example parsing, against
TensorFlow's own."""
import gzip
import os
import zlib

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


def _bytes_read(function):
    """(function(), bytes this process read meanwhile) by /proc/self/io's rchar, which counts every read call."""
    def rchar():
        with open('/proc/self/io') as f:
            return int(next(line for line in f if line.startswith('rchar:')).split()[1])
    before = rchar()
    result = function()
    return result, rchar() - before


@pytest.mark.skipif(not os.path.exists('/proc/self/io'), reason='needs Linux /proc/self/io')
def test_counting_scales_by_seeking_and_verifying_reads_every_payload(tmp_path):
    path = str(tmp_path / 'big')
    write_tfrecord(path, [bytes(1 << 20)] * 30)  # 30 MB of payload: counting must not read it
    framing, read = _bytes_read(lambda: onu_tfrecord.read_framing(path, 'NONE'))
    assert framing == onu_tfrecord.Framing(30, None) and read < 1 << 20
    framing, read = _bytes_read(lambda: onu_tfrecord.read_framing(path, 'NONE', verify=True))
    assert framing == onu_tfrecord.Framing(30, None) and read >= 30 << 20


@pytest.mark.parametrize('verify', (False, True))
@pytest.mark.parametrize('compression', sorted(COMPRESSIONS))
def test_a_cut_file_counts_its_complete_records_and_says_why(tmp_path, compression, verify):
    path = str(tmp_path / 'shard')
    write_tfrecord(path, [b'x' * 10, b'', b'y' * 3000], COMPRESSIONS[compression])
    whole = open(path, 'rb').read()
    assert onu_tfrecord.count_records(path, compression) == 3
    with open(path, 'wb') as f:
        f.write(whole[:len(whole) - 5])
    framing = onu_tfrecord.read_framing(path, compression, verify)
    assert framing.problem is not None
    assert framing.records == (2 if compression == 'NONE' else 3)  # compressed: the stream's end is what is cut
    read = []
    with pytest.raises(onu_tfrecord.DamagedRecord) as error:
        read.extend(onu_tfrecord.read_records(path, compression))
    assert (len(read), error.value.record, str(error.value)) == (framing.records, framing.records + 1, framing.problem)
    if compression == 'NONE':
        # Cut inside the last record's data, inside its length header, and right after the second record.
        for cut, complete, problem in ((len(whole) - 5, 2, 'cut short: the file ends inside it'),
                                       (26 + 16 + 4, 2, 'inside its 12-byte header'), (26 + 16, 2, None),
                                       (7, 0, 'inside its 12-byte header')):
            with open(path, 'wb') as f:
                f.write(whole[:cut])
            framing = onu_tfrecord.read_framing(path, compression, verify)
            assert framing.records == complete, cut
            assert (framing.problem is None) == (problem is None) and (problem or '') in (framing.problem or ''), cut


def test_a_flipped_length_byte_is_a_corrupted_header_not_a_wrong_count(tmp_path):
    path = str(tmp_path / 'shard')
    write_tfrecord(path, [b'a' * 100] * 3)
    data = bytearray(open(path, 'rb').read())
    data[100 + 16] ^= 0x01  # the second record's length
    open(path, 'wb').write(bytes(data))
    assert onu_tfrecord.read_framing(path, 'NONE') == onu_tfrecord.Framing(1, 'record 2 has a corrupted length header')
    records = onu_tfrecord.read_records(path, 'NONE')
    assert next(records) == b'a' * 100
    with pytest.raises(onu_tfrecord.DamagedRecord, match='^record 2 has a corrupted length header$'):
        next(records)


@pytest.mark.parametrize('compression', sorted(COMPRESSIONS))
def test_a_flipped_payload_byte_is_caught_by_its_crc_alone(tmp_path, compression):
    path = str(tmp_path / 'shard')
    write_tfrecord(path, [b'a' * 100] * 3)
    data = bytearray(open(path, 'rb').read())
    data[116 + 12 + 50] ^= 0x01  # a byte in the middle of the second record's payload
    # Damaged before compression, so the compressed stream is sound and only the payload's CRC tells.
    compress = {'NONE': bytes, 'GZIP': gzip.compress, 'ZLIB': zlib.compress}[compression]
    open(path, 'wb').write(compress(bytes(data)))
    with pytest.raises(tf.errors.DataLossError, match='corrupted record'):  # TensorFlow's reader agrees
        list(tf.compat.v1.io.tf_record_iterator(path, tf.io.TFRecordOptions(COMPRESSIONS[compression])))
    assert onu_tfrecord.read_framing(path, compression) == onu_tfrecord.Framing(3, None)  # the framing is whole
    problem = 'record 2 is damaged (its payload CRC does not match)'
    assert onu_tfrecord.read_framing(path, compression, verify=True) == onu_tfrecord.Framing(1, problem)
    read = []
    with pytest.raises(onu_tfrecord.DamagedRecord) as error:
        read.extend(onu_tfrecord.read_records(path, compression))
    assert (read, error.value.record, str(error.value)) == ([b'a' * 100], 2, problem)


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
