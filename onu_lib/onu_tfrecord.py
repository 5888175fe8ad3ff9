"""TFRecord files without TensorFlow (CRC-32C from google-crc32c): compression told from the bytes, records counted
from their framing, payloads checked against their CRCs, and the keys and small values of their tf.train.Examples.

A record is an 8-byte little-endian length, its 4-byte masked CRC-32C, the payload and the payload's masked CRC;
GZIP and ZLIB files are that sequence compressed as one stream. Counting reads each length and seeks past the
payload (a few bytes read per record); verifying reads every payload and checks its CRC.

    compression = sniff_compression(path)             # 'NONE', 'GZIP', 'ZLIB', or None: not a TFRecord file
    framing = read_framing(path, compression)          # .records complete, .problem: why the rest is not
    framing = read_framing(path, compression, verify=True)  # the same, reading and checking every payload
    for payload in read_records(path, compression):    # the serialized records; DamagedRecord where one is
        features = parse_example(payload)              # {key: Feature(kind, values)}
    write_records(path, [serialize_example({'image/class/label': 3, ...})], compression)   # as TensorFlow writes
"""
import dataclasses
import gzip
import io
import itertools
import os
import struct
import zlib

import google_crc32c

COMPRESSIONS = ('NONE', 'GZIP', 'ZLIB')
LENGTH_BYTES = 8
HEADER_BYTES = LENGTH_BYTES + 4  # the length and its CRC
FOOTER_BYTES = 4  # the payload's CRC
_CRC_MASK_DELTA = 0xA282EAD8
_GZIP_MAGIC = b'\x1f\x8b'
_CHUNK_BYTES = 1 << 16
# Feature kinds of a tf.train.Example (the field numbers of tf.train.Feature's oneof).
BYTES, FLOAT, INT64 = 'bytes', 'float', 'int64'
_FEATURE_KINDS = {1: BYTES, 2: FLOAT, 3: INT64}
# protobuf wire types
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


def masked_crc32c(*parts):
    """The masked CRC-32C of the concatenated parts (bytes-like), as TFRecord framing stores it."""
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def _is_record_header(header):
    """True if 12 bytes are a record's length followed by that length's masked CRC."""
    return (len(header) == HEADER_BYTES
            and masked_crc32c(header[:LENGTH_BYTES]) == int.from_bytes(header[LENGTH_BYTES:], 'little'))


def _looks_like_zlib(start):
    """True if the bytes begin with a zlib stream header (deflate, a valid header checksum)."""
    return len(start) >= 2 and start[0] & 0x0F == 8 and (start[0] << 8 | start[1]) % 31 == 0


class _Inflating(io.RawIOBase):
    """A readable stream of the decompressed bytes of a GZIP or ZLIB file; it just ends where the file is cut."""

    def __init__(self, fileobj):
        super().__init__()
        self._file = fileobj
        self._inflater = zlib.decompressobj(wbits=32 + zlib.MAX_WBITS)  # 32: a gzip or zlib header, either
        self._pending = b''
        self.error = None  # why the stream stopped early, if it did

    def readable(self):
        return True

    def readinto(self, buffer):
        while not self._pending and not self._inflater.eof and self.error is None:
            chunk = self._file.read(_CHUNK_BYTES)
            if not chunk:
                self.error = 'the compressed stream is cut short'
                break
            try:
                self._pending = self._inflater.decompress(chunk)
            except zlib.error as error:
                self.error = f'corrupted compressed data ({error})'
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count

    def close(self):
        self._file.close()
        super().close()


class _RecordStream:
    """The uncompressed bytes of a TFRecord file with read(n) and skip(n); `error` says why it ended early."""

    def __init__(self, path, compression):
        self._file = open(path, 'rb')  # pylint: disable=consider-using-with  (closed by close())
        self._size = os.fstat(self._file.fileno()).st_size if compression == 'NONE' else None
        self._inflating = None
        if compression != 'NONE':
            self._inflating = _Inflating(self._file)
            self._file = io.BufferedReader(self._inflating, _CHUNK_BYTES)
        self.position = 0

    @property
    def error(self):
        """Why a compressed stream ended before its end marker (None if it did not)."""
        return self._inflating.error if self._inflating else None

    def read(self, count):
        """Returns up to count bytes (fewer at the end)."""
        data = self._file.read(count)
        self.position += len(data)
        return data

    def skip(self, count):
        """Skips count bytes; returns False if the stream ends first."""
        if self._size is not None:
            if self.position + count > self._size:
                return False
            self._file.seek(count, os.SEEK_CUR)
            self.position += count
            return True
        while count:
            skipped = len(self.read(min(count, _CHUNK_BYTES)))
            if not skipped:
                return False
            count -= skipped
        return True

    def close(self):
        """Closes the file."""
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def sniff_compression(path):
    """'NONE', 'GZIP' or 'ZLIB' as the file's first bytes show (empty: 'NONE'); None if it is not a TFRecord file."""
    with open(path, 'rb') as f:
        start = f.read(HEADER_BYTES)
    if not start or _is_record_header(start):
        return 'NONE'
    compression = 'GZIP' if start.startswith(_GZIP_MAGIC) else 'ZLIB' if _looks_like_zlib(start) else None
    if compression is None:
        return None
    with _RecordStream(path, compression) as stream:
        header = stream.read(HEADER_BYTES)
    return compression if not header or _is_record_header(header) else None


@dataclasses.dataclass(frozen=True)
class Framing:
    """What the framing of a TFRecord file says: its complete records, and why the rest is not one."""
    records: int
    problem: str = None  # None: the file ends exactly after its last record


class DamagedRecord(Exception):
    """Where a TFRecord file stops being whole: .record, the record's 1-based number; .problem, what is wrong."""

    def __init__(self, record, problem):
        super().__init__(problem)
        self.record = record
        self.problem = problem


def _next_frame(stream, index):
    """(payload length, None) of the next record, the stream left at its payload; (None, problem or None) at the end."""
    header = stream.read(HEADER_BYTES)
    if not header:
        return None, stream.error
    if len(header) < HEADER_BYTES:
        return None, stream.error or f'record {index + 1} is cut short inside its {HEADER_BYTES}-byte header'
    if not _is_record_header(header):
        return None, f'record {index + 1} has a corrupted length header'
    return int.from_bytes(header[:LENGTH_BYTES], 'little'), None


def _walk(path, compression, read, verify):
    """Yields the payload of each complete record (None unless read); DamagedRecord where the file stops being whole;
    verify: check each payload's CRC."""
    with _RecordStream(path, compression) as stream:
        for index in itertools.count():
            length, problem = _next_frame(stream, index)
            if length is None:
                if problem:
                    raise DamagedRecord(index + 1, problem)
                return
            cut_short = f'record {index + 1} is cut short: the file ends inside it'
            if not read:
                if not stream.skip(length + FOOTER_BYTES):
                    raise DamagedRecord(index + 1, stream.error or cut_short)
                yield None
                continue
            payload = stream.read(length)
            footer = stream.read(FOOTER_BYTES)
            if len(payload) < length or len(footer) < FOOTER_BYTES:
                raise DamagedRecord(index + 1, stream.error or cut_short)
            if verify and masked_crc32c(payload) != int.from_bytes(footer, 'little'):
                raise DamagedRecord(index + 1, f'record {index + 1} is damaged (its payload CRC does not match)')
            yield payload


def read_framing(path, compression, verify=False):
    """The Framing of a TFRecord file: length headers read, payloads skipped, or with verify read and CRC-checked."""
    count = 0
    try:
        for _ in _walk(path, compression, read=verify, verify=verify):
            count += 1
    except DamagedRecord as error:
        return Framing(count, error.problem)
    return Framing(count)


def count_records(path, compression):
    """The number of complete records in a TFRecord file (what a short or cut write leaves is not counted)."""
    return read_framing(path, compression).records


def read_records(path, compression):
    """Yields the payload of each record of a TFRecord file, CRC checked; DamagedRecord where the file is not whole."""
    yield from _walk(path, compression, read=True, verify=True)


def first_record(path, compression):
    """The payload of the first record of a TFRecord file (CRC not checked), or None if it has no complete one."""
    try:
        return next(_walk(path, compression, read=True, verify=False), None)
    except DamagedRecord:
        return None


def write_record(file, parts):
    """Writes one record whose payload is the parts (bytes-like), not joined (not copied), to the binary file."""
    length = sum(memoryview(part).nbytes for part in parts).to_bytes(LENGTH_BYTES, 'little')
    file.write(length + masked_crc32c(length).to_bytes(4, 'little'))
    for part in parts:
        file.write(part)
    file.write(masked_crc32c(*parts).to_bytes(4, 'little'))


def write_records(path, payloads, compression='NONE'):
    """Writes the payloads as a TFRecord file at path, as TensorFlow's TFRecordWriter does; returns their count."""
    count = 0
    with open(path, 'wb') as raw:
        compressed = (gzip.GzipFile(fileobj=raw, mode='wb') if compression == 'GZIP' else
                      zlib.compressobj() if compression == 'ZLIB' else None)
        for payload in payloads:
            framed = io.BytesIO()
            write_record(framed, [payload])
            record = framed.getvalue()
            if compression == 'ZLIB':
                raw.write(compressed.compress(record))
            else:
                (compressed or raw).write(record)
            count += 1
        if compression == 'ZLIB':
            raw.write(compressed.flush())
        elif compressed is not None:
            compressed.close()
    return count


# ----------------------------------------------------------------------------------------------
# tf.train.Example: Example{features: Features{feature: map<string, Feature>}},
# Feature{oneof bytes_list, float_list, int64_list}, each a message with one repeated field.

class NotAnExample(Exception):
    """The payload is not a serialized tf.train.Example."""


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of an Example: its kind (bytes, float, int64) and values; skipped bytes values: their sizes."""
    kind: str
    values: tuple
    skipped: bool = False  # a bytes value was too long to keep: values holds the lengths of all of them


class _Reader:
    """Reads protobuf wire format from a stream (read/skip), counting its position."""

    def __init__(self, stream, start):
        self._stream = stream
        self.position = start

    def read(self, count):
        data = self._stream.read(count)
        if len(data) < count:
            raise NotAnExample('it ends inside a field')
        self.position += count
        return data

    def skip(self, count):
        if not self._stream.skip(count):
            raise NotAnExample('it ends inside a field')
        self.position += count

    def varint(self):
        result = shift = 0
        while True:
            byte = self.read(1)[0]
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result & 0xFFFFFFFFFFFFFFFF  # a 10th byte may carry bits past 64: protobuf drops them
            shift += 7
            if shift > 63:
                raise NotAnExample('a varint is longer than 10 bytes')

    def tag(self):
        key = self.varint()
        return key >> 3, key & 7

    def length(self, end):
        length = self.varint()
        if self.position + length > end:
            raise NotAnExample('a field runs past the end of its message')
        return length

    def message_end(self, end):
        """Reads a length-delimited field's length; returns where the field ends."""
        length = self.length(end)
        return self.position + length

    def skip_fixed(self, count, end):
        if self.position + count > end:
            raise NotAnExample('a field runs past the end of its message')
        self.skip(count)

    def skip_field(self, wire_type, end):
        if wire_type == _VARINT:
            self.varint()
        elif wire_type == _FIXED64:
            self.skip_fixed(8, end)
        elif wire_type == _LENGTH_DELIMITED:
            self.skip(self.length(end))
        elif wire_type == _FIXED32:
            self.skip_fixed(4, end)
        else:
            raise NotAnExample(f'wire type {wire_type}')


def _signed64(value):
    """An int64 from its varint encoding (negative numbers are 10-byte two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature_values(reader, kind, end, max_bytes):
    """The values of one BytesList/FloatList/Int64List message ending at end: (values, skipped)."""
    values, skipped = [], False
    while reader.position < end:
        field, wire_type = reader.tag()
        if field != 1:
            reader.skip_field(wire_type, end)
        elif kind == BYTES and wire_type == _LENGTH_DELIMITED:
            length = reader.length(end)
            if max_bytes is not None and length > max_bytes:
                reader.skip(length)
                values.append(length)
                skipped = True
            else:
                values.append(reader.read(length))
        elif kind == FLOAT and wire_type in (_LENGTH_DELIMITED, _FIXED32):
            length = reader.length(end) if wire_type == _LENGTH_DELIMITED else 4
            if length % 4:
                raise NotAnExample(f'a packed float list of {length} bytes')
            values += struct.unpack(f'<{length // 4}f', reader.read(length))
        elif kind == INT64 and wire_type == _LENGTH_DELIMITED:
            packed_end = reader.message_end(end)
            while reader.position < packed_end:
                values.append(_signed64(reader.varint()))
        elif kind == INT64 and wire_type == _VARINT:
            values.append(_signed64(reader.varint()))
        else:
            raise NotAnExample(f'a {kind} list holds wire type {wire_type}')
    if skipped:  # every value by its length, as the long ones are
        values = [value if isinstance(value, int) else len(value) for value in values]
    return tuple(values), skipped


def _feature(reader, end, max_bytes):
    """A tf.train.Feature message ending at end."""
    feature = Feature(BYTES, ())
    while reader.position < end:
        field, wire_type = reader.tag()
        if field in _FEATURE_KINDS and wire_type == _LENGTH_DELIMITED:
            list_end = reader.message_end(end)
            kind = _FEATURE_KINDS[field]
            values, skipped = _feature_values(reader, kind, list_end, max_bytes)
            feature = Feature(kind, values, skipped)
        else:
            reader.skip_field(wire_type, end)
    return feature


def _map_entry(reader, end, max_bytes):
    """A (key, Feature) entry of Features.feature, ending at end."""
    key, feature = None, Feature(BYTES, ())
    while reader.position < end:
        field, wire_type = reader.tag()
        if field == 1 and wire_type == _LENGTH_DELIMITED:
            try:
                key = reader.read(reader.length(end)).decode('utf-8')
            except UnicodeDecodeError:
                raise NotAnExample('a feature key is not UTF-8') from None
        elif field == 2 and wire_type == _LENGTH_DELIMITED:
            feature = _feature(reader, reader.message_end(end), max_bytes)
        else:
            reader.skip_field(wire_type, end)
    if key is None:
        raise NotAnExample('a feature has no key')
    return key, feature


def _example(reader, end, max_bytes):
    """{key: Feature} of a tf.train.Example message ending at end."""
    features = {}
    while reader.position < end:
        field, wire_type = reader.tag()
        if field != 1 or wire_type != _LENGTH_DELIMITED:
            raise NotAnExample(f'field {field} is not an Example\'s')
        features_end = reader.message_end(end)
        while reader.position < features_end:
            field, wire_type = reader.tag()
            if field == 1 and wire_type == _LENGTH_DELIMITED:
                key, feature = _map_entry(reader, reader.message_end(features_end), max_bytes)
                features[key] = feature
            else:
                reader.skip_field(wire_type, features_end)
    return features


def _varint(value):
    """The protobuf varint encoding of a non-negative int (int64s below 0 as their 64-bit two's complement)."""
    value &= 0xFFFFFFFFFFFFFFFF
    encoded = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            encoded.append(byte)
            return bytes(encoded)
        encoded.append(byte | 0x80)


def _field(number, parts):
    """A length-delimited protobuf field around parts (a list of bytes), as a list of bytes: a big image is copied
    once, when the message is joined, not once per enclosing message."""
    return [_varint(number << 3 | _LENGTH_DELIMITED), _varint(sum(len(part) for part in parts)), *parts]


def _feature_message(values):
    """A tf.train.Feature of values: bytes or str (bytes_list), int (int64_list, packed) or float (float_list)."""
    values = values if isinstance(values, (list, tuple)) else [values]
    if values and isinstance(values[0], int):
        return _field(3, _field(1, [_varint(value) for value in values]))
    if values and isinstance(values[0], float):
        return _field(2, _field(1, [struct.pack(f'<{len(values)}f', *values)]))
    return _field(1, [part for value in values for part in _field(1, [value.encode() if isinstance(value, str)
                                                                        else value])])


def serialize_example(features):
    """A serialized tf.train.Example of {key: value or list of values} (bytes/str, int or float), keys sorted."""
    entries = [part for key in sorted(features)
               for part in _field(1, _field(1, [key.encode()]) + _field(2, _feature_message(features[key])))]
    return b''.join(_field(1, entries))


def parse_example(payload, max_bytes=None):
    """{key: Feature} of a serialized tf.train.Example (bytes values over max_bytes kept as lengths); NotAnExample if
    it is not one."""
    return _example(_Reader(_BytesStream(payload), 0), len(payload), max_bytes)


class _BytesStream:
    """read/skip over bytes in memory (the stream interface _Reader reads)."""

    def __init__(self, data):
        self._view = memoryview(data)
        self._position = 0

    def read(self, count):
        data = self._view[self._position:self._position + count].tobytes()
        self._position += len(data)
        return data

    def skip(self, count):
        if self._position + count > len(self._view):
            return False
        self._position += count
        return True


def scan_examples(path, compression, max_bytes):
    """Yields {key: Feature} of each record of a TFRecord file, bytes values over max_bytes seeked past unread;
    NotAnExample naming the record for one that is not an Example."""
    with _RecordStream(path, compression) as stream:
        for index in itertools.count():
            length, _ = _next_frame(stream, index)
            if length is None:
                return
            start = stream.position
            try:
                features = _example(_Reader(stream, start), start + length, max_bytes)
            except NotAnExample as error:
                raise NotAnExample(f'record {index + 1}: {error}') from None
            if not stream.skip(FOOTER_BYTES):
                return
            yield features
