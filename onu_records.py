"""Record conversion: a photo folder (DATA/train/<class>/*, DATA/val/<class>/*) into TFRecords, once for many trainings.

Two record kinds, both with the TF-slim metadata keys (label, class text, upright height/width, channels=3,
file name relative to the data dir):
  encoded: image/encoded = the original file bytes when it is an upright RGB/grayscale JPEG (no decode at all),
           otherwise the upright RGB image re-encoded (JPEG sources as JPEG, others as PNG);
  raw:     image/raw = upright RGB uint8 pixels, H*W*3 bytes, decoded by every CPU core.
Train examples are shuffled across shards with --seed; val keeps the sorted order. Each shard is written
under a temporary name, read back and counted, then renamed. labels.txt and manifest.json (record counts,
sizes, skipped files) sit next to the shards. Unchanged inputs make a re-run a no-op.

The library behind convert_to_tfrecord.py (and onu_train.py's on-demand conversion): convert()
does it all. Worker processes import this module, so it imports TensorFlow only on first use.
"""

import contextlib
import hashlib
import io
import math
import os
import random
import re
import time
from multiprocessing import shared_memory

from tqdm import tqdm

import onu_dataset
from onu_dataset import DataError

TARGET_SHARD_BYTES = 100 << 20  # automatic --num_shards: about this many bytes per shard
RAW_TASK_BYTES = 8 << 20  # pixels decoded per worker task: fewer, larger tasks cost the writing process less
RAW_TASK_MAX_IMAGES = 32  # ... but small enough that every worker gets some
RAW_AHEAD_BYTES = 96 << 20  # pixels decoded ahead of the writer: workers keep busy while it verifies a shard
# A TFRecord is: uint64 length, uint32 CRC of the length, the data, uint32 CRC of the data.
RECORD_LENGTH_BYTES = 8
RECORD_FRAMING_BYTES = 8 + 4 + 4
REENCODE_JPEG_QUALITY = 95
_TEMP_SHARD = re.compile(r'^(?:train|val)-(?:raw|encoded)-\d{5}-of-\d{5}\.tfrecord\.tmp-\d+$')


def _tf():
    """TensorFlow, imported on first use: worker processes import this module and must start fast."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf


def _raw_payload(info):
    """(upright RGB uint8 pixel bytes, 'raw'), or (None, reason) if the file does not decode."""
    try:
        return onu_dataset.upright_rgb(info.path, info.orientation).tobytes(), onu_dataset.PAYLOAD_RAW
    except Exception as error:  # a damaged file that passed the header check; reported, not fatal
        return None, f'decode failed: {" ".join(str(error).split())}'


def encoded_payload(info):
    """(file bytes or re-encoded upright RGB image, 'jpeg' or 'png'), or (None, reason)."""
    if info.is_plain_jpeg:
        with open(info.path, 'rb') as f:
            return f.read(), onu_dataset.PAYLOAD_JPEG
    try:
        image = onu_dataset.upright_rgb(info.path, info.orientation)
    except Exception as error:  # a damaged file that passed the header check; reported, not fatal
        return None, f'decode failed: {" ".join(str(error).split())}'
    buffer = io.BytesIO()
    if info.image_format in onu_dataset.JPEG_FORMATS:
        image.save(buffer, 'JPEG', quality=REENCODE_JPEG_QUALITY)
        return buffer.getvalue(), onu_dataset.PAYLOAD_JPEG
    image.save(buffer, 'PNG')
    return buffer.getvalue(), onu_dataset.PAYLOAD_PNG


_PAYLOAD_KEYS = {'raw': onu_dataset.KEY_RAW, 'encoded': onu_dataset.KEY_ENCODED}
_attached_blocks = {}  # in a worker process: the shared-memory blocks it has attached, by name


def _raw_into_block(task):
    """Worker: decodes images into a shared-memory block, image k at offset k * slot_bytes.

    Returns (byte count, 'raw') or (None, skip reason) per image.
    """
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
    """Yields (payload, payload format) or (None, skip reason) for each image of order, made by pool's workers.

    Raw pixels (megabytes per image) come back through shared memory instead of being pickled through a
    pipe, which would cost the writing process as much time again as the decoding saves it.
    """
    if record_format == 'encoded':
        needs_decoding = not all(info.is_plain_jpeg for info in order)
        yield from onu_dataset.parallel_map(encoded_payload, order, pool if needs_decoding else None, window)
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
            for b, results in enumerate(onu_dataset.parallel_map(_raw_into_block, tasks, pool, window)):
                buffer = blocks[b % len(blocks)].buf
                for k, (size, detail) in enumerate(results):
                    start = k * slot_bytes
                    yield (None, detail) if size is None else (bytes(buffer[start:start + size]), detail)


def _serialized_example(info, payload, payload_key, payload_format, filename):
    """One tf.train.Example as bytes (map keys sorted, so the same input gives the same bytes)."""
    example = _tf().train.Example()
    feature = example.features.feature
    feature[payload_key].bytes_list.value.append(payload)
    feature[onu_dataset.KEY_FORMAT].bytes_list.value.append(payload_format.encode())
    feature[onu_dataset.KEY_LABEL].int64_list.value.append(info.label)
    feature[onu_dataset.KEY_TEXT].bytes_list.value.append(info.class_name.encode('utf-8'))
    feature[onu_dataset.KEY_HEIGHT].int64_list.value.append(info.height)
    feature[onu_dataset.KEY_WIDTH].int64_list.value.append(info.width)
    feature[onu_dataset.KEY_CHANNELS].int64_list.value.append(onu_dataset.CHANNELS)
    feature[onu_dataset.KEY_FILENAME].bytes_list.value.append(os.fsencode(filename))
    return example.SerializeToString(deterministic=True)


def count_records(path, compression):
    """The number of complete records in a TFRecord file.

    Uncompressed files are counted from their framing: each record's 8-byte length leads to the next,
    and a record that does not end within the file is not counted. That is what a short or cut write
    leaves; the checksums are not re-read, since the file was just written. Compressed files are read
    in full, checksums included.
    """
    if compression == 'NONE':
        size, offset, count = os.path.getsize(path), 0, 0
        with open(path, 'rb') as f:
            while True:
                header = f.read(RECORD_LENGTH_BYTES)
                if len(header) < RECORD_LENGTH_BYTES:
                    return count
                offset += RECORD_FRAMING_BYTES + int.from_bytes(header, 'little')
                if offset > size:
                    return count
                count += 1
                f.seek(offset)
    tf = _tf()
    options = tf.io.TFRecordOptions(compression_type=onu_dataset.tf_compression_type(compression))
    return sum(1 for _ in tf.compat.v1.io.tf_record_iterator(path, options))


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
    if split != 'train':
        return list(images)
    shuffled = list(images)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def _write_verified_shard(path, examples, compression):
    """Writes serialized examples to a temporary file, reads it back and counts, then renames it to path."""
    tf = _tf()
    temp_path = f'{path}.tmp-{os.getpid()}'
    try:
        options = tf.io.TFRecordOptions(compression_type=onu_dataset.tf_compression_type(compression))
        written = 0
        with tf.io.TFRecordWriter(temp_path, options) as writer:
            for example in examples:
                writer.write(example)
                written += 1
        found = count_records(temp_path, compression)
        if found != written:
            raise DataError(f'{temp_path}: wrote {written} records but read back {found}: '
                            f'check free disk space and re-run with --overwrite')
        os.replace(temp_path, path)
    finally:
        if os.path.exists(temp_path):
            os.remove(temp_path)
    return written


def _convert_split(data_dir, output_dir, split, record_format, images, options, pool, skipped):
    """Writes the shards of one split in one record format; returns its manifest entry."""
    started = time.time()
    payload_key = _PAYLOAD_KEYS[record_format]
    order = _split_order(images, split, options['seed'])
    num_shards = _num_shards(options['num_shards'], order, record_format)
    payloads = _payloads(order, record_format, pool, window=2 * options['processes'])
    entry = {'shards': [], 'records': 0, 'records_per_class': {}, 'record_bytes': 0, 'source_bytes': 0,
             'pixel_bytes': 0}
    progress = tqdm(total=len(order), desc=f'{split} {record_format}', unit='img', disable=None, leave=False)

    def examples(chunk):
        """Serialized examples of one shard, counting what is written and skipping what does not decode."""
        for info, (payload, payload_format) in zip(chunk, payloads):
            progress.update()
            filename = onu_dataset.relative_name(info.path, data_dir)
            if payload is None:
                if options['strict']:
                    raise DataError(f'{info.path}: {payload_format} (--strict): fix or remove the file')
                skipped.append({'path': filename, 'reason': payload_format, 'format': record_format})
                continue
            pixel_bytes = info.height * info.width * onu_dataset.CHANNELS
            if record_format == 'raw' and len(payload) != pixel_bytes:
                raise DataError(f'{info.path}: decoded to {len(payload)} bytes, expected H*W*C = {info.height}*'
                                f'{info.width}*{onu_dataset.CHANNELS}: the file changed during conversion; re-run')
            entry['records_per_class'][info.class_name] = entry['records_per_class'].get(info.class_name, 0) + 1
            entry['source_bytes'] += info.num_bytes
            entry['pixel_bytes'] += pixel_bytes
            yield _serialized_example(info, payload, payload_key, payload_format, filename)

    bounds = [round(i * len(order) / num_shards) for i in range(num_shards + 1)]
    with contextlib.closing(payloads):
        for index in range(num_shards):
            name = onu_dataset.shard_filename(split, record_format, index, num_shards)
            path = os.path.join(output_dir, name)
            records = _write_verified_shard(path, examples(order[bounds[index]:bounds[index + 1]]),
                                            options['compression'])
            entry['shards'].append({'file': name, 'records': records, 'bytes': os.path.getsize(path)})
            entry['records'] += records
            entry['record_bytes'] += entry['shards'][-1]['bytes']
    progress.close()
    entry['records_per_class'] = {name: entry['records_per_class'].get(name, 0) for name in options['class_names']}
    entry['seconds'] = round(time.time() - started, 3)
    return entry


def _image_size_stats(images):
    """Min, max and mean upright width and height of a split's images."""
    stats = {}
    for key in ('width', 'height'):
        values = [getattr(info, key) for info in images]
        stats[key] = {'min': min(values), 'max': max(values), 'mean': round(sum(values) / len(values), 1)}
    return stats


def _input_entries(data_dir):
    """Paths of the class folders of each split and of everything in them, sorted; no image is read."""
    paths = []
    for split in onu_dataset.SPLITS:
        split_dir = os.path.join(data_dir, split)
        if os.path.isdir(split_dir):
            for class_name in onu_dataset.visible_subdirs(split_dir):
                class_dir = os.path.join(split_dir, class_name)
                paths += [class_dir] + sorted(entry.path for entry in os.scandir(class_dir))
    return paths


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
        if (old_build.get('inputs') == build['inputs'] and None not in entries
                and set(old['splits']) == set(splits) and all(_shards_intact(output_dir, e) for e in entries)):
            reusable.add(record_format)
    return reusable


def _check_output_dir(data_dir, output_dir):
    """DataError if output_dir lies inside the photo folders, which are never written to."""
    output = os.path.realpath(output_dir)
    for split in onu_dataset.SPLITS:
        split_dir = os.path.realpath(os.path.join(data_dir, split))
        if output == split_dir or output.startswith(split_dir + os.sep):
            raise DataError(f'--output_dir={output_dir} is inside the photo folder {split_dir}: '
                            f'choose a folder outside train/ and val/, e.g. {os.path.join(data_dir, "tfrecords")}')


def _remove_stale_temp_shards(output_dir):
    """Removes temporary shards left by an interrupted conversion (they never look like finished shards)."""
    for name in os.listdir(output_dir):
        if _TEMP_SHARD.match(name):
            os.remove(os.path.join(output_dir, name))


def convert(data_dir, output_dir=None, formats=onu_dataset.RECORD_FORMATS, num_shards=None, compression='NONE',
            strict=False, overwrite=False, processes=None, seed=0):
    """Converts data_dir's photos to TFRecords in output_dir (default data_dir/tfrecords); returns the manifest.

    num_shards None or 0 picks about TARGET_SHARD_BYTES per shard; processes None or 0 uses every core.
    Records already built from the same inputs with the same settings are kept (a re-run is a no-op);
    overwrite rebuilds the requested formats anyway. Records of other formats are kept while they match
    the inputs and compression, else removed. strict turns every skipped file (except hidden/system files)
    into a DataError. Workers are spawned processes: a script calling this needs the usual
    `if __name__ == '__main__':` guard.
    """
    known_formats = bool(formats) and set(formats) <= set(onu_dataset.RECORD_FORMATS)
    if not known_formats or compression not in onu_dataset.COMPRESSIONS:
        raise ValueError(f'formats must be among {onu_dataset.RECORD_FORMATS} and compression among '
                         f'{onu_dataset.COMPRESSIONS}, got {formats} and {compression!r}')
    formats = tuple(f for f in onu_dataset.RECORD_FORMATS if f in formats)
    output_dir = output_dir or os.path.join(data_dir, onu_dataset.RECORDS_SUBDIR)
    _check_output_dir(data_dir, output_dir)
    entries = _input_entries(data_dir)
    build = {'inputs': _inputs_digest(data_dir, entries), 'compression': compression,
             'num_shards': num_shards or None, 'seed': seed}
    splits = [s for s in onu_dataset.SPLITS if os.path.isdir(os.path.join(data_dir, s))]
    old = _existing_manifest(output_dir)
    reusable = _reusable_formats(old, output_dir, build, splits)
    to_build = [f for f in formats if overwrite or f not in reusable or old['build'][f] != build]
    kept = [f for f in onu_dataset.RECORD_FORMATS if f in reusable and f not in to_build]
    if not to_build and set(kept) == set(old['build']) and not (strict and _unreadable(old['skipped'])):
        print(f'{output_dir}: {", ".join(formats)} records are up to date with {data_dir}; nothing to do '
              f'(--overwrite rebuilds them)')
        return old

    workers = onu_dataset.worker_count(processes)
    with contextlib.ExitStack() as stack:
        # Started before the listing, so that the workers' start-up and the disk reads overlap it.
        pool = stack.enter_context(onu_dataset.process_pool(workers)) if 'raw' in to_build else None
        _prefetch(entries)
        class_names, listings, skipped = _list_inputs(data_dir, splits, strict)
        if pool is None and not all(info.is_plain_jpeg for images, _ in listings.values() for info in images):
            pool = stack.enter_context(onu_dataset.process_pool(workers))  # to re-encode those images
        os.makedirs(output_dir, exist_ok=True)
        manifest = {'version': onu_dataset.MANIFEST_VERSION, 'compression': compression, 'class_names': class_names,
                    'splits': {split: {f: old['splits'][split][f] for f in kept} for split in listings},
                    'build': {f: old['build'][f] for f in kept},
                    'skipped': skipped + [s for s in (old or {}).get('skipped', []) if s.get('format') in kept],
                    'image_size_stats': {split: _image_size_stats(images) for split, (images, _) in listings.items()}}
        onu_dataset.write_manifest(output_dir, manifest)  # readers never see records that are being replaced
        onu_dataset.write_labels(os.path.join(output_dir, onu_dataset.LABELS_FILENAME), class_names)
        _remove_stale_temp_shards(output_dir)
        options = {'seed': seed, 'num_shards': num_shards, 'processes': workers, 'compression': compression,
                   'strict': strict, 'class_names': class_names}
        for record_format in to_build:
            for split, (images, _) in listings.items():
                manifest['splits'][split][record_format] = _convert_split(
                    data_dir, output_dir, split, record_format, images, options, pool, manifest['skipped'])
            manifest['build'][record_format] = build
    onu_dataset.write_manifest(output_dir, manifest)
    _remove_replaced_shards(output_dir, old, manifest)
    return manifest


def _unreadable(skipped):
    """The skipped-file entries that are not hidden or system files."""
    return [s for s in skipped if s['reason'] != onu_dataset.REASON_HIDDEN]


def _list_inputs(data_dir, splits, strict):
    """(class names, {split: (images, skipped)}, skipped as manifest entries); DataError on any skip if strict."""
    class_names = onu_dataset.find_class_names(data_dir)
    listings = {split: onu_dataset.list_split_images(data_dir, split, class_names) for split in splits}
    skipped = [{'path': onu_dataset.relative_name(path, data_dir), 'reason': reason}
               for split in splits for path, reason in listings[split][1]]
    unreadable = _unreadable(skipped)
    if strict and unreadable:
        raise DataError(f'{os.path.join(data_dir, unreadable[0]["path"])}: {unreadable[0]["reason"]} '
                        f'({len(unreadable)} unreadable files; --strict): fix or remove them, or drop --strict')
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
                          if s['path'].startswith(split + '/') and s['reason'] != onu_dataset.REASON_HIDDEN
                          and s.get('format', record_format) == record_format)
            rows.append([split, record_format, entry['records']]
                        + [entry['records_per_class'][name] for name in class_names]
                        + [skipped, f'{entry["source_bytes"] / 1e6:.1f}', f'{entry["record_bytes"] / 1e6:.1f}',
                           f'{entry["record_bytes"] / max(1, entry["source_bytes"]):.3f}', f'{entry["seconds"]:.2f}'])
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    lines = ['  '.join(str(cell).rjust(width) for cell, width in zip(row, widths)) for row in [header] + rows]
    unreadable = _unreadable(manifest['skipped'])
    lines += [f'skipped {s["path"]}: {s["reason"]}' for s in unreadable]
    hidden = len(manifest['skipped']) - len(unreadable)
    if hidden:
        lines.append(f'ignored {hidden} hidden or system files (.DS_Store, Thumbs.db, ...)')
    return '\n'.join(lines)
