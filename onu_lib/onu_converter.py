"""Record conversion: a photo folder (DATA/train/<class>/*, DATA/val/<class>/*) into TFRecords, once for many trainings.

Two record kinds, both with the TF-slim metadata keys (label, class text, upright height/width, channels=3,
file name relative to the data dir):
  encoded: image/encoded = the file's bytes when it decodes to the upright RGB image as it is (no decode at all),
           otherwise the upright RGB image re-encoded (JPEG sources as JPEG, others as PNG);
  raw:     image/raw = upright RGB uint8 pixels, H*W*3 bytes, decoded by every CPU core.
Train examples are shuffled across shards with --seed; val keeps the sorted order. Each shard is written under a
temporary name, read back and counted, then renamed. labels.txt and manifest.json sit next to the shards.

The library behind convert_to_tfrecord.py and training's on-demand conversion: convert(). No TensorFlow: onu_tfrecord
writes the records byte for byte as TensorFlow would.
"""
import contextlib
import dataclasses
import functools
import hashlib
import io
import itertools
import math
import os
import random
import re
import time
from multiprocessing import shared_memory

from PIL import Image

from tqdm import tqdm

from onu_lib import onu_dataset
from onu_lib import onu_layouts
from onu_lib import onu_photos
from onu_lib import onu_pool
from onu_lib import onu_tfrecord
from onu_lib.onu_errors import DataError

TARGET_SHARD_BYTES = 100 << 20  # automatic --num_shards: about this many bytes per shard
RAW_TASK_BYTES = 8 << 20  # pixels decoded per worker task: fewer, larger tasks cost the writing process less
RAW_TASK_MAX_IMAGES = 32  # ... but small enough that every worker gets some
RAW_AHEAD_BYTES = 96 << 20  # pixels decoded ahead of the writer: workers keep busy while it verifies a shard
REENCODE_JPEG_QUALITY = 95
_TEMP_SHARD = re.compile(r'^(?:train|val)-(?:raw|encoded)-\d{5}-of-\d{5}\.tfrecord\.tmp-\d+$')


def _raw_payload(info):
    """(upright RGB uint8 pixel bytes, 'raw'), or (None, reason) if the file does not decode."""
    try:
        return onu_photos.upright_rgb(info.path, info.orientation).tobytes(), onu_dataset.PAYLOAD_RAW
    except Exception as error:  # a damaged file that passed the header check; reported, not fatal
        return None, f'decode failed: {" ".join(str(error).split())}'


def encoded_payload(info):
    """(file bytes or re-encoded upright RGB image, 'jpeg' or 'png'), or (None, reason)."""
    if info.is_kept_as_is:
        with open(info.path, 'rb') as f:
            return f.read(), onu_dataset.PAYLOAD_JPEG if info.image_format in onu_photos.JPEG_FORMATS else \
                onu_dataset.PAYLOAD_PNG
    try:
        image = onu_photos.upright_rgb(info.path, info.orientation)
    except Exception as error:  # a damaged file that passed the header check; reported, not fatal
        return None, f'decode failed: {" ".join(str(error).split())}'
    buffer = io.BytesIO()
    if info.image_format in onu_photos.JPEG_FORMATS:
        image.save(buffer, 'JPEG', quality=REENCODE_JPEG_QUALITY)
        return buffer.getvalue(), onu_dataset.PAYLOAD_JPEG
    image.save(buffer, 'PNG')
    return buffer.getvalue(), onu_dataset.PAYLOAD_PNG


_attached_blocks = {}  # in a worker process: the shared-memory blocks it has attached, by name


def _raw_into_block(task):
    """Worker: decodes images into a shared-memory block, image k at offset k * slot_bytes; returns (byte count, 'raw')
    or (None, skip reason) per image."""
    infos, block_name, slot_bytes = task
    block = _attached_blocks.get(block_name)
    if block is None:
        block = _attached_blocks[block_name] = shared_memory.SharedMemory(block_name)
    results = []
    for k, info in enumerate(infos):
        payload, detail = _raw_payload(info)
        if payload is not None and len(payload) > slot_bytes:
            payload, detail = None, 'decode failed: the file changed during conversion'
        if payload is not None:
            block.buf[k * slot_bytes:k * slot_bytes + len(payload)] = payload
        results.append((None if payload is None else len(payload), detail))
    return results


@contextlib.contextmanager
def _shared_blocks(count, size):
    """count shared-memory blocks of size bytes each, released on exit."""
    blocks = [shared_memory.SharedMemory(create=True, size=max(1, size)) for _ in range(count)]
    try:
        yield blocks
    finally:
        for block in blocks:
            block.close()
            block.unlink()


def _payloads(order, record_format, pool, window):
    """Yields (payload, payload format) or (None, skip reason) for each image of order, made by pool's workers; raw
    pixels come back through shared memory (pickling megabytes through a pipe would stall the writing process)."""
    if record_format == 'encoded':
        needs_decoding = not all(info.is_kept_as_is for info in order)
        yield from onu_pool.parallel_map(encoded_payload, order, pool if needs_decoding else None, window)
    elif pool is None:
        yield from map(_raw_payload, order)
    else:
        slot_bytes = max(info.height * info.width * onu_dataset.CHANNELS for info in order)
        batch = max(1, min(RAW_TASK_MAX_IMAGES, RAW_TASK_BYTES // slot_bytes))
        batches = [tuple(order[i:i + batch]) for i in range(0, len(order), batch)]
        window = min(len(batches), max(window, RAW_AHEAD_BYTES // (batch * slot_bytes)))
        # One block more than batches in flight: parallel_map submits the next batch before the block of
        # the batch just returned has been copied out.
        with _shared_blocks(window + 1, batch * slot_bytes) as blocks:
            tasks = ((infos, blocks[b % len(blocks)].name, slot_bytes) for b, infos in enumerate(batches))
            for b, results in enumerate(onu_pool.parallel_map(_raw_into_block, tasks, pool, window)):
                buffer = blocks[b % len(blocks)].buf
                for k, (size, detail) in enumerate(results):
                    start = k * slot_bytes
                    yield (None, detail) if size is None else (bytes(buffer[start:start + size]), detail)


def _num_shards(requested, images, record_format):
    """The shard count of one split and format: requested, or about TARGET_SHARD_BYTES each; never empty shards."""
    if not requested:
        if record_format == 'raw':
            total = sum(info.height * info.width * onu_dataset.CHANNELS for info in images)
        else:
            total = sum(info.num_bytes for info in images)
        requested = math.ceil(total / TARGET_SHARD_BYTES)
    return max(1, min(requested, len(images)))


def _split_order(images, split, seed):
    """Train examples shuffled with seed (so shards mix classes); other splits keep the sorted order."""
    order = list(images)
    if split == 'train':
        random.Random(seed).shuffle(order)
    return order


def _write_verified_shard(path, examples, compression):
    """Writes serialized examples to a temporary file, reads it back and counts, then renames it to path."""
    temp_path = f'{path}.tmp-{os.getpid()}'
    try:
        written = onu_tfrecord.write_records(temp_path, examples, compression)
        found = onu_tfrecord.count_records(temp_path, compression)
        if found != written:
            raise DataError(f'{temp_path}: wrote {written} records but read back {found}: '
                            f'check free disk space and re-run with --overwrite')
        os.replace(temp_path, path)
    finally:
        if os.path.exists(temp_path):
            os.remove(temp_path)
    return written


@dataclasses.dataclass(frozen=True)
class ConvertedImage:
    """One image made ready for a record of this repo's: its payload and what the record says of it."""
    filename: str          # image/filename: relative to the data dir, or <shard>#<index> for another tool's record
    where: str             # what to name in messages: the photo's path, or the record
    payload: bytes = None  # None: skipped, for skip_reason
    payload_format: str = ''
    label: int = 0
    class_name: str = ''
    height: int = 0
    width: int = 0
    source_bytes: int = 0
    skip_reason: str = None


def _converted_photos(data_dir, order, payloads):
    """Yields the ConvertedImage of each photo of order, its payload from payloads (_payloads)."""
    for info, (payload, detail) in zip(order, payloads):
        filename = onu_dataset.relative_name(info.path, data_dir)
        if payload is None:
            yield ConvertedImage(filename, info.path, skip_reason=detail)
            continue
        yield ConvertedImage(filename, info.path, payload, detail, info.label, info.class_name, info.height,
                             info.width, info.num_bytes)


def _write_split(output_dir, split, record_format, images, count, num_shards, options, skipped):
    """Writes ConvertedImages (count of them) of one split into num_shards shards; returns the manifest entry."""
    started = time.time()
    payload_key = onu_dataset.IMAGE_KEYS[record_format]
    entry = {'shards': [], 'records': 0, 'records_per_class': {}, 'record_bytes': 0, 'source_bytes': 0,
             'pixel_bytes': 0}
    sizes = []
    progress = tqdm(total=count, desc=f'{split} {record_format}', unit='img', disable=None, leave=False)

    def examples(shard_count):
        """Serialized examples of one shard, counting what is written and skipping what does not decode."""
        for image in itertools.islice(images, shard_count):
            progress.update()
            if image.payload is None:
                if options['strict']:
                    raise DataError(f'{image.where}: {image.skip_reason} (--strict): fix or remove the file')
                skipped.append({'path': image.filename, 'reason': image.skip_reason, 'format': record_format,
                                'split': split})
                continue
            pixel_bytes = image.height * image.width * onu_dataset.CHANNELS
            if record_format == 'raw' and len(image.payload) != pixel_bytes:
                raise DataError(f'{image.where}: decoded to {len(image.payload)} bytes, expected H*W*C = '
                                f'{image.height}*{image.width}*{onu_dataset.CHANNELS}: the file changed during '
                                f'conversion; re-run')
            entry['records_per_class'][image.class_name] = entry['records_per_class'].get(image.class_name, 0) + 1
            entry['source_bytes'] += image.source_bytes
            entry['pixel_bytes'] += pixel_bytes
            sizes.append((image.width, image.height))
            yield onu_tfrecord.serialize_example({  # keys sorted: the same input gives the same bytes
                payload_key: image.payload, onu_dataset.KEY_FORMAT: image.payload_format,
                onu_dataset.KEY_LABEL: image.label, onu_dataset.KEY_TEXT: image.class_name,
                onu_dataset.KEY_HEIGHT: image.height, onu_dataset.KEY_WIDTH: image.width,
                onu_dataset.KEY_CHANNELS: onu_dataset.CHANNELS, onu_dataset.KEY_FILENAME: os.fsencode(image.filename)})

    bounds = [round(i * count / num_shards) for i in range(num_shards + 1)]
    for index in range(num_shards):
        name = onu_dataset.shard_filename(split, record_format, index, num_shards)
        path = os.path.join(output_dir, name)
        records = _write_verified_shard(path, examples(bounds[index + 1] - bounds[index]), options['compression'])
        entry['shards'].append({'file': name, 'records': records, 'bytes': os.path.getsize(path)})
        entry['records'] += records
        entry['record_bytes'] += entry['shards'][-1]['bytes']
    progress.close()
    entry['records_per_class'] = {name: entry['records_per_class'].get(name, 0) for name in options['class_names']}
    entry['seconds'] = round(time.time() - started, 3)
    return entry, sizes


def _convert_split(data_dir, output_dir, split, record_format, images, options, pool, skipped):
    """Writes the shards of one split of photos in one record format; returns (manifest entry, image sizes)."""
    order = _split_order(images, split, options['seed'])
    num_shards = _num_shards(options['num_shards'], order, record_format)
    payloads = _payloads(order, record_format, pool, window=2 * options['processes'])
    with contextlib.closing(payloads):
        return _write_split(output_dir, split, record_format, _converted_photos(data_dir, order, payloads),
                            len(order), num_shards, options, skipped)


# ----------------------------------------------------------------------------------------------
# Records of other tools (onu_layouts) as the source.

@dataclasses.dataclass(frozen=True)
class RecordSource:
    """What a worker needs to convert one record of another tool's: its keys and the label offset (small to send)."""
    data_format: str   # of the source records: 'raw' or 'encoded'
    image_key: str
    label_key: str
    height_key: str
    width_key: str
    filename_key: str
    labels_offset: int
    num_classes: int
    folder: str


def _converted_payload(image_bytes, features, source, record_format):
    """(payload, payload format, width, height) of one record's image in record_format; UnreadableImage if unusable.
    The pixels are those of reading the records as they are (RGB, no EXIF orientation, as the tools' readers do)."""
    if source.data_format == 'raw':
        height = features[source.height_key].values[0]
        width = features[source.width_key].values[0]
        mode = onu_layouts.RAW_MODES[len(image_bytes) // (height * width)]
        image = Image.frombytes(mode, (width, height), image_bytes)
        if record_format == 'raw':
            return onu_photos.to_rgb(image).tobytes(), onu_dataset.PAYLOAD_RAW, width, height
        buffer = io.BytesIO()
        image.save(buffer, 'PNG')
        return buffer.getvalue(), onu_dataset.PAYLOAD_PNG, width, height
    header = onu_photos.read_image_header(image_bytes)
    if record_format == 'encoded' and onu_photos.tensorflow_decodes(header):
        payload_format = (onu_dataset.PAYLOAD_JPEG if header.image_format in onu_photos.JPEG_FORMATS
                          else header.image_format.lower())
        return image_bytes, payload_format, header.width, header.height
    with Image.open(io.BytesIO(image_bytes)) as image:
        rgb = onu_photos.to_rgb(image)
    if record_format == 'raw':
        return rgb.tobytes(), onu_dataset.PAYLOAD_RAW, header.width, header.height
    buffer = io.BytesIO()
    rgb.save(buffer, 'PNG')
    return buffer.getvalue(), onu_dataset.PAYLOAD_PNG, header.width, header.height


def convert_foreign_record(task, source, record_format):
    """Worker: the ConvertedImage (no class name yet) of a task: (serialized record of another tool, its name)."""
    serialized, name = task
    where = os.path.join(source.folder, name)
    try:
        features = onu_tfrecord.parse_example(serialized)
        filename = name
        if source.filename_key and features.get(source.filename_key, onu_tfrecord.Feature('bytes', ())).values:
            filename = features[source.filename_key].values[0].decode('utf-8', errors='replace') or name
        image_bytes = features[source.image_key].values[0]
        stored = features[source.label_key].values[0]
    except (onu_tfrecord.NotAnExample, KeyError, IndexError) as error:
        reason = f'no {error}' if isinstance(error, KeyError) else f'not a usable record ({error or "empty value"})'
        return ConvertedImage(name, where, skip_reason=reason)
    label = stored - source.labels_offset
    if not 0 <= label < source.num_classes:
        return ConvertedImage(filename, where, skip_reason=f'label {stored} is not one of the {source.num_classes} '
                                                           f'classes (labels offset {source.labels_offset})')
    try:
        payload, payload_format, width, height = _converted_payload(image_bytes, features, source, record_format)
    except (onu_photos.UnreadableImage, OSError, ValueError, KeyError, IndexError, ZeroDivisionError) as error:
        return ConvertedImage(filename, where, skip_reason=' '.join(str(error).split()) or type(error).__name__)
    return ConvertedImage(filename, where, payload, payload_format, label, '', height, width, len(serialized))


def _foreign_records(record_set):
    """Yields (serialized record, <file>#<index>) of each record of record_set; DataError at a damaged one."""
    for path in record_set.files:
        try:
            for index, serialized in enumerate(onu_tfrecord.read_records(path, record_set.compression)):
                yield serialized, f'{os.path.basename(path)}{onu_dataset.RECORD_NAME_SEPARATOR}{index}'
        except onu_tfrecord.DamagedRecord as error:
            raise DataError(f'{path}: {error}; re-create the file with the tool that wrote it, '
                            f'or move it away') from None


def _convert_record_split(record_set, output_dir, record_format, options, pool, skipped):
    """Writes one split of another tool's records in record_format, in their order; returns (entry, image sizes)."""
    growth = 12 if record_format == 'raw' and record_set.data_format == 'encoded' else 1  # pixels vs JPEG bytes
    num_shards = options['num_shards'] or math.ceil(record_set.record_bytes * growth / TARGET_SHARD_BYTES)
    num_shards = max(1, min(num_shards, record_set.num_examples))
    layout = record_set.layout
    source = RecordSource(record_set.data_format, record_set.image_key, layout.label_key, layout.height_key,
                          layout.width_key, record_set.filename_key, record_set.labels.offset,
                          len(record_set.labels.class_names), record_set.folder)
    converted = onu_pool.parallel_map(
        functools.partial(convert_foreign_record, source=source, record_format=record_format),
        _foreign_records(record_set), pool, window=2 * options['processes'])
    named = (image if image.payload is None else dataclasses.replace(
        image, class_name=record_set.labels.class_names[image.label]) for image in converted)
    with contextlib.closing(converted):
        return _write_split(output_dir, record_set.split, record_format, named, record_set.num_examples,
                            num_shards, options, skipped)


def _image_size_stats(sizes):
    """Min, max and mean upright width and height of a split's images, from (width, height) pairs."""
    stats = {}
    for index, key in enumerate(('width', 'height')):
        values = [size[index] for size in sizes] or [0]
        stats[key] = {'min': min(values), 'max': max(values), 'mean': round(sum(values) / len(values), 1)}
    return stats


def _inputs_digest(data_dir, paths):
    """A digest of the names, sizes and modification times of paths: it changes when any photo does."""
    digest = hashlib.sha256()
    for path in paths:
        stat = os.stat(path)
        digest.update(os.fsencode(onu_dataset.relative_name(path, data_dir)))
        digest.update(f'\0{stat.st_size}\0{stat.st_mtime_ns}\n'.encode())
    return digest.hexdigest()


def _prefetch(paths):
    """Asks the operating system to start reading the files now: listing and conversion then wait less on the disk."""
    if not hasattr(os, 'posix_fadvise'):  # Linux has it; elsewhere the reads simply happen when needed
        return
    for path in paths:
        if os.path.isfile(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)


def _existing_manifest(output_dir):
    """The manifest already in output_dir, or None if there is none (or it is unreadable, so it is rebuilt)."""
    try:
        return onu_dataset.read_manifest(output_dir)
    except DataError:
        return None


def _shards_intact(output_dir, entry):
    """True if every shard of a manifest entry exists with the recorded size."""
    for shard in entry['shards']:
        path = os.path.join(output_dir, shard['file'])
        if not os.path.isfile(path) or os.path.getsize(path) != shard['bytes']:
            return False
    return True


def _reusable_formats(old, output_dir, build, splits):
    """Formats whose records in the old manifest were built from the same inputs and settings and are intact."""
    if old is None or old.get('compression') != build['compression']:
        return set()
    reusable = set()
    for record_format, old_build in old.get('build', {}).items():
        entries = [old['splits'].get(split, {}).get(record_format) for split in splits]
        same_inputs = all(old_build.get(key) == build.get(key) for key in ('inputs', 'validation_percent',
                                                                             'labels_offset'))
        if (same_inputs and None not in entries
                and set(old['splits']) == set(splits) and all(_shards_intact(output_dir, e) for e in entries)):
            reusable.add(record_format)
    return reusable


def _check_output_dir(data, output_dir):
    """DataError if output_dir lies inside the photo folders, which are never written to."""
    data_dir = data.path
    output = os.path.realpath(output_dir)
    split_dirs = [onu_dataset.split_dir(data_dir, split) for split in onu_dataset.SPLITS
                  if data.layout == onu_dataset.PHOTOS]
    for folder in split_dirs + onu_dataset.photo_folders(data_dir):
        folder = os.path.realpath(folder)
        if output == folder or output.startswith(folder + os.sep):
            raise DataError(f'--output_dir={output_dir} is inside the photo folder {folder}: '
                            f'choose a folder outside the class folders, e.g. {os.path.join(data_dir, "tfrecords")}')


def _remove_stale_temp_shards(output_dir):
    """Removes temporary shards left by an interrupted conversion (they never look like finished shards)."""
    for name in os.listdir(output_dir):
        if _TEMP_SHARD.match(name):
            os.remove(os.path.join(output_dir, name))


def default_output_dir(data):
    """Where a DataDir's records go: its records folder, or, if the folder is read-only, a folder in the cache (said)."""
    records_dir = data.records_dir()
    output_dir = records_dir if onu_dataset.can_write_in(records_dir) else onu_dataset.cached_records_dir(data.path)
    if output_dir != records_dir:
        print(f'{data.path} is read-only: writing its records to {output_dir} (found there by every script; '
              f'--output_dir chooses another place)', flush=True)
    return output_dir


def convert(data, output_dir=None, formats=onu_dataset.RECORD_FORMATS, num_shards=None, compression='NONE',
            strict=False, overwrite=False, processes=None, seed=0):
    """Converts a DataDir's photos, or the records other tools wrote there, to this repo's TFRecords; returns the
    manifest.

    output_dir None: default_output_dir; num_shards None or 0: about TARGET_SHARD_BYTES each; processes None or 0:
    every core. Records built from the same inputs and settings are kept unless overwrite. strict turns every skipped
    file (but hidden/system ones) into a DataError. Workers are spawned: the caller needs the __main__ guard.
    """
    known_formats = bool(formats) and set(formats) <= set(onu_dataset.RECORD_FORMATS)
    if not known_formats or compression not in onu_dataset.COMPRESSIONS:
        raise ValueError(f'formats must be among {onu_dataset.RECORD_FORMATS} and compression among '
                         f'{onu_dataset.COMPRESSIONS}, got {formats} and {compression!r}')
    formats = tuple(f for f in onu_dataset.RECORD_FORMATS if f in formats)
    data_dir, foreign, validation_percent = data.path, data.foreign, data.validation_percent
    if foreign is None:
        data.photo_class_names()  # no photos: say so before anything is written
    output_dir = output_dir or default_output_dir(data)
    _check_output_dir(data, output_dir)
    entries = data.source_paths()
    build = {'inputs': _inputs_digest(data_dir, entries), 'compression': compression,
             'num_shards': num_shards or None, 'seed': seed}
    if foreign is not None:
        labels = foreign.labels(data.labels_offset)
        build['labels_offset'] = labels.offset
        splits = [s for s in onu_dataset.SPLITS if any(group.split == s for group in foreign.groups)]
    else:
        splits = data.photo_splits()
        if data.layout == onu_dataset.CLASS_FOLDERS:
            build['validation_percent'] = validation_percent
    old = _existing_manifest(output_dir)
    reusable = _reusable_formats(old, output_dir, build, splits)
    to_build = [f for f in formats if overwrite or f not in reusable or old['build'][f] != build]
    kept = [f for f in onu_dataset.RECORD_FORMATS if f in reusable and f not in to_build]
    if not to_build and set(kept) == set(old['build']) and not (strict and _unreadable(old['skipped'])):
        print(f'{output_dir}: {", ".join(formats)} records are up to date with {data_dir}; nothing to do '
              f'(--overwrite rebuilds them)')
        return _reported(old, output_dir)

    workers = onu_pool.worker_count(processes)
    with contextlib.ExitStack() as stack:
        # Started before the listing, so that the workers' start-up and the disk reads overlap it.
        pool = stack.enter_context(onu_pool.process_pool(workers)) if 'raw' in to_build else None
        _prefetch(entries)
        if foreign is not None:
            class_names, listings, skipped = list(labels.class_names), None, []
            splits_written = {split: None for split in splits}
            pool = pool or stack.enter_context(onu_pool.process_pool(workers))
        else:
            class_names, listings, skipped = _list_inputs(data, splits, strict)
            splits_written = listings
            if pool is None and not all(info.is_kept_as_is for images, _ in listings.values() for info in images):
                pool = stack.enter_context(onu_pool.process_pool(workers))  # to re-encode those images
        os.makedirs(output_dir, exist_ok=True)
        manifest = {'version': onu_dataset.MANIFEST_VERSION, 'compression': compression, 'class_names': class_names,
                    'splits': {split: {f: old['splits'][split][f] for f in kept} for split in splits_written},
                    'build': {f: old['build'][f] for f in kept},
                    'skipped': skipped + [s for s in (old or {}).get('skipped', []) if s.get('format') in kept],
                    'image_size_stats': dict((old or {}).get('image_size_stats', {}))}
        if foreign is not None:
            manifest['source'] = {'layout': foreign.layout.name, 'folder': foreign.folder,
                                  'labels_offset': labels.offset, 'labels_evidence': labels.evidence}
        if 'validation_percent' in build:
            manifest['validation_percent'] = validation_percent
        onu_dataset.write_manifest(output_dir, manifest)  # readers never see records that are being replaced
        onu_dataset.write_labels(os.path.join(output_dir, onu_dataset.LABELS_FILENAME), class_names)
        _remove_stale_temp_shards(output_dir)
        options = {'seed': seed, 'num_shards': num_shards, 'processes': workers, 'compression': compression,
                   'strict': strict, 'class_names': class_names}
        for record_format in to_build:
            for split in splits_written:
                if foreign is not None:
                    available = [group.data_format for group in foreign.groups if group.split == split]
                    source_format = record_format if record_format in available else available[0]
                    record_set = foreign.record_set(split, source_format, labels.offset)
                    entry, sizes = _convert_record_split(record_set, output_dir, record_format, options, pool,
                                                         manifest['skipped'])
                else:
                    entry, sizes = _convert_split(data_dir, output_dir, split, record_format, listings[split][0],
                                                  options, pool, manifest['skipped'])
                manifest['splits'][split][record_format] = entry
                manifest['image_size_stats'][split] = _image_size_stats(sizes)
            manifest['build'][record_format] = build
    onu_dataset.write_manifest(output_dir, manifest)
    _remove_replaced_shards(output_dir, old, manifest)
    return _reported(manifest, output_dir)


def _reported(manifest, output_dir):
    """Prints onu_dataset.skipped_line of the files the manifest lists as skipped, if any; returns the manifest."""
    reasons = {(s.get('split'), s['path']): s['reason'] for s in manifest['skipped']}  # once, if skipped in each format
    if reasons:
        formats = {f for split in manifest['splits'].values() for f in split}
        # Each file looked at was written in every format or skipped in it (in all, when the listing left it out).
        total = max((sum(split[f]['records'] for split in manifest['splits'].values() if f in split)
                     + sum(1 for s in manifest['skipped'] if s.get('format', f) == f) for f in formats),
                    default=len(reasons))
        full_list = os.path.join(output_dir, onu_dataset.MANIFEST_FILENAME)
        print(onu_dataset.skipped_line(list(reasons.values()), total, full_list), flush=True)
    return manifest


def _unreadable(skipped):
    """The skipped-file entries that are not hidden or system files."""
    return [s for s in skipped if s['reason'] != onu_photos.REASON_HIDDEN]


def _list_inputs(data, splits, strict):
    """(class names, {split with images: (images, skipped)}, skipped manifest entries); DataError if strict skips."""
    data_dir, validation_percent = data.path, data.validation_percent
    class_names = data.photo_class_names()
    listings = {split: onu_dataset.list_split_images(data_dir, split, class_names, validation_percent)
                for split in splits}
    skipped = [{'path': onu_dataset.relative_name(path, data_dir), 'reason': reason, 'split': split}
               for split in splits for path, reason in listings[split][1]]
    unreadable = _unreadable(skipped)
    if strict and unreadable:
        raise DataError(f'{os.path.join(data_dir, unreadable[0]["path"])}: {unreadable[0]["reason"]} '
                        f'({len(unreadable)} unreadable files; --strict): fix or remove them, or drop --strict')
    for split in splits:
        if not listings[split][0]:
            print(f'{data_dir}: no {split} photos (--validation_percent={validation_percent:g} of '
                  f'{sum(len(images) for images, _ in listings.values())}): no {split} records written', flush=True)
            del listings[split]
    return class_names, listings, skipped


def _remove_replaced_shards(output_dir, old, manifest):
    """Deletes shards named by the old manifest that the new one no longer lists (all written by this script)."""
    if old is None:
        return
    current = {s['file'] for split in manifest['splits'].values() for entry in split.values() for s in entry['shards']}
    for split in old.get('splits', {}).values():
        for entry in split.values():
            for shard in entry['shards']:
                path = os.path.join(output_dir, shard['file'])
                if shard['file'] not in current and os.path.isfile(path):
                    os.remove(path)


def summary_table(manifest):
    """The conversion summary as text: images per class, skipped, source MB, record MB, ratio, seconds."""
    class_names = manifest['class_names']
    header = ['split', 'format', 'images'] + class_names + ['skipped', 'source MB', 'record MB', 'ratio', 'seconds']
    rows = []
    for split, formats in manifest['splits'].items():
        for record_format, entry in formats.items():
            skipped = sum(1 for s in manifest['skipped']
                          if s.get('split', s['path'].split('/')[0]) == split and s['reason'] != onu_photos.REASON_HIDDEN
                          and s.get('format', record_format) == record_format)
            rows.append([split, record_format, entry['records']]
                        + [entry['records_per_class'][name] for name in class_names]
                        + [skipped, f'{entry["source_bytes"] / 1e6:.1f}', f'{entry["record_bytes"] / 1e6:.1f}',
                           f'{entry["record_bytes"] / max(1, entry["source_bytes"]):.3f}', f'{entry["seconds"]:.2f}'])
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    return '\n'.join('  '.join(str(cell).rjust(width) for cell, width in zip(row, widths)) for row in [header] + rows)
