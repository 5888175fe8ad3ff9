"""The on-disk layout of ONU photo folders and of this repo's TFRecords: the one place for it.

Photos:  DATA/train/<class>/*, DATA/val/<class>/*  (class ids = sorted train class-folder names, 0-based;
         the val folder may also be called validation/ or test/)
         or PHOTOS/<class>/* with no split: a file is held out for val when the hash of its path relative
         to PHOTOS falls below --validation_percent (split_of), so adding photos never moves an old one.
Records: DATA/tfrecords/ holding the shards, labels.txt and manifest.json (see convert_to_tfrecord.py);
         for a read-only DATA, the same under the cache folder (cache_dir()).

Also the image reading every tool shares (format sniffing, EXIF orientation) and the worker-process helpers
of the data tools. Pure Python + Pillow, no TensorFlow: every script and worker process imports it cheaply.
"""

import collections
import contextlib
import dataclasses
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import sys
import unicodedata

from PIL import Image

from onu_lib import onu_tfrecord

DEFAULT_DATA_DIR = '/tmp/onu_data'  # every script's default --data_dir: the built-in sample data
SPLITS = ('train', 'val')
# The names a split goes by in folder and file names, in order of preference ('test' only when no 'val').
SPLIT_NAMES = {'train': ('train',), 'val': ('val', 'validation', 'test')}
RECORD_FORMATS = ('raw', 'encoded')
DATA_FORMATS = ('images',) + RECORD_FORMATS
COMPRESSIONS = onu_tfrecord.COMPRESSIONS
DEFAULT_VALIDATION_PERCENT = 10.0  # class folders without a split: the share of photos held out for val
CACHE_DIR_ENV = 'ONU_CACHE_DIR'

RECORDS_SUBDIR = 'tfrecords'
LABELS_FILENAME = 'labels.txt'
MANIFEST_FILENAME = 'manifest.json'
MANIFEST_VERSION = 1

KEY_ENCODED = 'image/encoded'
KEY_RAW = 'image/raw'
KEY_FORMAT = 'image/format'
KEY_LABEL = 'image/class/label'
KEY_TEXT = 'image/class/text'
KEY_HEIGHT = 'image/height'
KEY_WIDTH = 'image/width'
KEY_CHANNELS = 'image/channels'
KEY_FILENAME = 'image/filename'

# Values of KEY_FORMAT: what the payload bytes are.
PAYLOAD_JPEG = 'jpeg'
PAYLOAD_PNG = 'png'
PAYLOAD_RAW = 'raw'
CHANNELS = 3
# Raw pixels of other tools' records (PIL's tobytes of the photo as opened): bytes per pixel -> Pillow mode.
# All become RGB as the photos would: grey replicated, alpha dropped.
RAW_MODES = {1: 'L', 3: 'RGB', 4: 'RGBA'}
# A record that names no file is named <shard file>#<index> (its position in the shard, from 0).
RECORD_NAME_SEPARATOR = '#'

JPEG_FORMATS = ('JPEG', 'MPO')  # Pillow calls multi-picture camera JPEGs 'MPO'; they decode as JPEG.
# Files kept byte for byte in encoded records: TensorFlow decodes them to the same RGB pixels as Pillow's
# convert('RGB') (alpha dropped, grey and palette expanded). CMYK JPEGs and 16-bit PNGs are not among them.
KEPT_MODES = {'JPEG': ('RGB', 'L'), 'MPO': ('RGB', 'L'), 'PNG': ('RGB', 'L', 'RGBA', 'LA', 'P')}
TF_DECODABLE_FORMATS = JPEG_FORMATS + ('PNG', 'GIF', 'BMP', 'WEBP')  # what tf.io.decode_image reads
SYSTEM_FILENAMES = ('thumbs.db', 'ehthumbs.db', 'desktop.ini', 'icon\r')
REASON_HIDDEN = 'hidden or system file'
EXIF_ORIENTATION_TAG = 0x0112
# EXIF orientation -> the Pillow transpose that makes the image upright (as ImageOps.exif_transpose does).
ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_JPEG_END_MARKER = b'\xff\xd9'
_TAIL_BYTES = 64


class DataError(Exception):
    """A problem with the user's data; str(error) is one line naming the path and the fix."""


class UnreadableImage(Exception):
    """A file that cannot be used as a training image; str(error) is the reason."""


@dataclasses.dataclass
class ImageInfo:
    """One usable photo: where it is, its class, and what its header says."""
    path: str
    label: int
    class_name: str
    height: int  # upright, after the EXIF orientation is applied
    width: int  # upright
    orientation: int  # EXIF 1..8, 1 = none
    image_format: str  # sniffed from the content: 'JPEG', 'PNG', 'BMP', 'GIF', ...
    mode: str  # Pillow mode: 'RGB', 'L', 'CMYK', 'RGBA', ...
    num_bytes: int

    @property
    def is_kept_as_is(self):
        """True if the file's own bytes already decode to the upright RGB image (a JPEG or PNG, see KEPT_MODES)."""
        return self.mode in KEPT_MODES.get(self.image_format, ()) and self.orientation == 1


def is_hidden(name):
    """True for dot-files and the system files file managers leave in photo folders."""
    return name.startswith('.') or name.lower() in SYSTEM_FILENAMES


def _has_jpeg_end_marker(fp):
    """True if the file ends with the JPEG end-of-image marker (ignoring zero padding)."""
    fp.seek(0, os.SEEK_END)
    fp.seek(max(0, fp.tell() - _TAIL_BYTES))
    return fp.read().rstrip(b'\x00').endswith(_JPEG_END_MARKER)


def _orientation(image):
    """The EXIF orientation Pillow would apply (1..8), 1 if absent or malformed."""
    try:
        value = image.getexif().get(EXIF_ORIENTATION_TAG, 1)
    except Exception:  # malformed EXIF blocks raise many kinds of errors; the photo itself is fine
        return 1
    return value if value in ORIENTATION_TRANSPOSE else 1


def relative_name(path, data_dir):
    """path relative to data_dir with '/' separators, as stored in image/filename and the manifest."""
    return os.path.relpath(path, data_dir).replace(os.sep, '/')


@dataclasses.dataclass(frozen=True)
class ImageHeader:
    """What an image's header says: format sniffed from the content, Pillow mode, stored size, EXIF orientation."""
    image_format: str  # 'JPEG', 'PNG', 'BMP', 'GIF', ...
    mode: str
    width: int  # as stored, before the EXIF orientation
    height: int
    orientation: int  # EXIF 1..8, 1 = none


def read_image_header(source):
    """The ImageHeader of an image file (a path) or of image bytes; UnreadableImage(reason) if it cannot be used.

    JPEGs (nearly all photos) are checked cheaply: header plus the end-of-image marker; only a JPEG
    without that marker is fully decoded to tell a truncated file from one with trailing data.
    Other formats have no such cheap check and are fully decoded.
    """
    image_format = None
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            image_format, mode, (width, height) = image.format, image.mode, image.size
            if image_format not in JPEG_FORMATS or not _has_jpeg_end_marker(image.fp):
                image.load()
            orientation = _orientation(image)
    except Image.UnidentifiedImageError:
        raise UnreadableImage('not an image Pillow can read (content is not JPEG, PNG, BMP, GIF, ...)') from None
    except Exception as error:  # Pillow reports damaged files with OSError, SyntaxError, ValueError, ...
        what = f'damaged {image_format} file' if image_format else 'damaged or unsupported file'
        message = ' '.join(str(error).split()) or type(error).__name__
        raise UnreadableImage(f'{what}: {message}') from None
    return ImageHeader(image_format, mode, width, height, orientation)


def read_image_info(path, label=0, class_name=''):
    """The ImageInfo of one file (read_image_header's checks), or UnreadableImage(reason) if it cannot be used."""
    num_bytes = os.path.getsize(path)
    if num_bytes == 0:
        raise UnreadableImage('empty file')
    header = read_image_header(path)
    width, height = header.width, header.height
    if header.orientation in (5, 6, 7, 8):
        width, height = height, width
    return ImageInfo(path=path, label=label, class_name=class_name, height=height, width=width,
                     orientation=header.orientation, image_format=header.image_format, mode=header.mode,
                     num_bytes=num_bytes)


def upright_rgb(path, orientation):
    """The fully decoded image at path, EXIF orientation applied, as an RGB PIL image."""
    with Image.open(path) as image:
        image.load()
        if orientation in ORIENTATION_TRANSPOSE:
            image = image.transpose(ORIENTATION_TRANSPOSE[orientation])
        return image if image.mode == 'RGB' else image.convert('RGB')


def visible_subdirs(folder):
    """Sorted names of the non-hidden subfolders of folder (the class folders of a split)."""
    return sorted(entry.name for entry in os.scandir(folder)
                  if entry.is_dir() and not is_hidden(entry.name))


def _candidate_files(class_dir):
    """(path, skip reason or None) for every entry of a class folder, sorted by path."""
    for entry in sorted(os.scandir(class_dir), key=lambda e: e.name):
        if is_hidden(entry.name):
            yield entry.path, REASON_HIDDEN
        elif entry.is_dir():
            yield entry.path, 'subfolder (images in subfolders are not read; move them up into the class folder)'
        elif not entry.is_file():
            yield entry.path, 'not a regular file'
        else:
            yield entry.path, None


def _has_readable_image(class_dir):
    """True if at least one file in class_dir is a usable image."""
    for path, reason in _candidate_files(class_dir):
        if reason is None:
            try:
                read_image_info(path)
                return True
            except UnreadableImage:
                pass
    return False


def has_split_folders(data_dir):
    """True if data_dir keeps its photos in split folders (train/<class>/), False for bare class folders."""
    return os.path.isdir(os.path.join(data_dir, 'train'))


def split_dir(data_dir, split):
    """The folder of split's photos: data_dir/train, or the first of data_dir/{val,validation,test} there is."""
    names = SPLIT_NAMES[split]
    for name in names:
        if os.path.isdir(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    return os.path.join(data_dir, names[0])


def photo_splits(data_dir):
    """The splits data_dir has photos of: those with a folder, or both for bare class folders (split_of)."""
    return [split for split in SPLITS if not has_split_folders(data_dir) or os.path.isdir(split_dir(data_dir, split))]


def bare_class_folders(data_dir):
    """The visible subfolders of data_dir that would be classes of bare class folders (not tfrecords/)."""
    return [name for name in visible_subdirs(data_dir) if name != RECORDS_SUBDIR]


def split_of(relative_path, validation_percent):
    """'val' or 'train': the split of a photo of bare class folders, from its path relative to the folder.

    A hash, not a draw: the same on every run and machine, and adding photos never moves an old one.
    """
    name = unicodedata.normalize('NFC', relative_path)  # macOS spells accents decomposed
    position = int.from_bytes(hashlib.sha256(name.encode('utf-8')).digest()[:8], 'big') * 100.0 / 2 ** 64
    return 'val' if position < validation_percent else 'train'


def _check_has_readable_images(class_dirs, where):
    """DataError naming the first class folder without a usable image."""
    for class_dir in class_dirs:
        if not _has_readable_image(class_dir):
            raise DataError(f'{class_dir} has no readable images: add photos to it, '
                            f'or remove class {os.path.basename(class_dir)!r} from {where}')


def find_class_names(data_dir):
    """Sorted class-folder names (class id = index) of data_dir/train, or of bare class folders; DataError if none."""
    if not has_split_folders(data_dir):
        class_names = bare_class_folders(data_dir) if os.path.isdir(data_dir) else []
        if not class_names:
            raise DataError(f'{data_dir}: no photos found: put them in {data_dir}/<class>/ (or {data_dir}/train/<class>/ '
                            f'and {data_dir}/val/<class>/), or run python make_sample_data.py --data_dir={data_dir}')
        _check_has_readable_images([os.path.join(data_dir, name) for name in class_names], data_dir)
        return class_names
    train_dir = os.path.join(data_dir, 'train')
    class_names = visible_subdirs(train_dir)
    if not class_names:
        raise DataError(f'{train_dir} has no class folders: put each class\'s photos in {train_dir}/<class>/')
    split_dirs = [train_dir]
    val_dir = split_dir(data_dir, 'val')
    if os.path.isdir(val_dir):
        val_names = visible_subdirs(val_dir)
        if val_names != class_names:
            missing = sorted(set(class_names) - set(val_names))
            extra = sorted(set(val_names) - set(class_names))
            raise DataError(f'class folders of {val_dir} differ from {train_dir} (missing in val: {missing}, '
                            f'only in val: {extra}): give train/ and val/ the same class folders')
        split_dirs.append(val_dir)
    _check_has_readable_images([os.path.join(folder, name) for folder in split_dirs for name in class_names],
                               'train/ and val/')
    return class_names


def list_split_images(data_dir, split, class_names, validation_percent=DEFAULT_VALIDATION_PERCENT):
    """(images, skipped) of one split: ImageInfos sorted by (label, path) and (path, reason) pairs.

    Split folders: the files of split_dir(data_dir, split); bare class folders: the files split_of puts in split.
    """
    bare = not has_split_folders(data_dir)
    images, skipped = [], []
    for label, class_name in enumerate(class_names):
        class_dir = os.path.join(data_dir if bare else split_dir(data_dir, split), class_name)
        if not os.path.isdir(class_dir):
            raise DataError(f'{class_dir} not found: every split needs a folder for each class in {class_names}')
        for path, reason in _candidate_files(class_dir):
            if bare and split_of(relative_name(path, data_dir), validation_percent) != split:
                continue
            if reason is None:
                try:
                    images.append(read_image_info(path, label, class_name))
                    continue
                except UnreadableImage as error:
                    reason = str(error)
            skipped.append((path, reason))
    return images, skipped


def cache_dir():
    """Where what is derived from data folders is kept outside them: $ONU_CACHE_DIR, else the user's cache folder."""
    if os.environ.get(CACHE_DIR_ENV):
        return os.environ[CACHE_DIR_ENV]
    return os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'onu-classifier')


def folder_key(folder):
    """A file name for folder in the cache: its base name and a hash of its real path."""
    real = os.path.realpath(folder)
    return f'{os.path.basename(real) or "root"}-{hashlib.sha256(os.fsencode(real)).hexdigest()[:12]}'


def cached_records_dir(data_dir):
    """Where this repo's records of a read-only data_dir go: a folder of its own in the cache."""
    return os.path.join(cache_dir(), 'records', folder_key(data_dir))


def records_dirs(data_dir):
    """The folders holding this repo's records of data_dir (a manifest), in order: data_dir itself,
    data_dir/tfrecords, and its folder in the cache (where records of a read-only data_dir go)."""
    return [candidate for candidate in (data_dir, os.path.join(data_dir, RECORDS_SUBDIR), cached_records_dir(data_dir))
            if os.path.isfile(os.path.join(candidate, MANIFEST_FILENAME))]


def records_dir_for(data_dir, data_format=None):
    """Where the TFRecords of data_dir are: the first of records_dirs whose manifest lists data_format (None: any);
    data_dir/tfrecords if none does."""
    for candidate in records_dirs(data_dir):
        if data_format is None or any(data_format in formats for formats in
                                      read_manifest(candidate).get('splits', {}).values()):
            return candidate
    return os.path.join(data_dir, RECORDS_SUBDIR)


def can_write_in(folder):
    """True if files can be created in folder (made if missing): False on a read-only file system or without rights."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f'.write-probe-{os.getpid()}')
        with open(probe, 'wb'):
            pass
        os.remove(probe)
        return True
    except OSError:
        return False


def writable_records_dir(data_dir):
    """Where conversion writes data_dir's records: records_dir_for(data_dir), or cached_records_dir if that is read-only."""
    records_dir = records_dir_for(data_dir)
    return records_dir if can_write_in(records_dir) else cached_records_dir(data_dir)


def missing_data_dir_error(data_dir):
    """The DataError for a --data_dir that does not exist: how to make sample data, where to point instead."""
    return DataError(f'{data_dir}: data dir not found; make sample data with python make_sample_data.py '
                     f'--data_dir={data_dir}, or point --data_dir at your photos or records '
                     f'(README "Bring your own data")')


def shard_filename(split, record_format, index, num_shards):
    """The file name of one shard inside the records directory."""
    return f'{split}-{record_format}-{index:05d}-of-{num_shards:05d}.tfrecord'


def write_text_atomic(path, text):
    """Writes text to path through a temporary file and a rename, so readers never see half a file."""
    temp_path = f'{path}.tmp-{os.getpid()}'
    with open(temp_path, 'w', encoding='utf-8') as f:
        f.write(text)
    os.replace(temp_path, path)


def write_labels(path, class_names):
    """Writes TF-slim's labels file: one 'id:name' line per class."""
    write_text_atomic(path, ''.join(f'{label}:{name}\n' for label, name in enumerate(class_names)))


def read_labels(path):
    """The class names of a TF-slim labels file, ordered by id."""
    try:
        with open(path, encoding='utf-8') as f:
            lines = [line.rstrip('\n') for line in f if line.strip()]
    except FileNotFoundError:
        raise DataError(f'{path} not found: run python convert_to_tfrecord.py to write it') from None
    names = []
    for expected_id, line in enumerate(lines):
        label, sep, name = line.partition(':')
        if not sep or not label.strip().isdigit() or int(label) != expected_id or not name:
            raise DataError(f'{path}: line {expected_id + 1} is {line!r}, expected "{expected_id}:<class name>": '
                            f'fix the file or re-run python convert_to_tfrecord.py --overwrite')
        names.append(name)
    return names


def write_manifest(records_dir, manifest):
    """Writes records_dir/manifest.json atomically."""
    write_text_atomic(os.path.join(records_dir, MANIFEST_FILENAME),
                      json.dumps(manifest, indent=1, ensure_ascii=False) + '\n')


def read_manifest(records_dir):
    """The manifest dict written by convert_to_tfrecord.py in records_dir."""
    path = os.path.join(records_dir, MANIFEST_FILENAME)
    fix = f'run python convert_to_tfrecord.py --output_dir={records_dir} --data_dir=<your photo folder>'
    try:
        with open(path, encoding='utf-8') as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise DataError(f'{path} not found: {fix}') from None
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f'{path} is not valid JSON ({error}): {fix} --overwrite') from None
    if not isinstance(manifest, dict) or manifest.get('version') != MANIFEST_VERSION:
        raise DataError(f'{path} is not a version-{MANIFEST_VERSION} manifest: {fix} --overwrite')
    return manifest


def records_entry(manifest, split, record_format, records_dir):
    """The manifest entry of one split and record format; DataError saying how to make it if absent."""
    entry = manifest.get('splits', {}).get(split, {}).get(record_format)
    if entry is None:
        raise DataError(f'{records_dir} has no {record_format} records of {split}: run python convert_to_tfrecord.py '
                        f'--output_dir={records_dir} --format={record_format} --data_dir=<your photo folder>')
    return entry


def shard_paths(records_dir, manifest, split, record_format):
    """Full paths of the shards of one split and record format, in order."""
    entry = records_entry(manifest, split, record_format, records_dir)
    return [os.path.join(records_dir, shard['file']) for shard in entry['shards']]


def tf_compression_type(compression):
    """A manifest's compression ('NONE', 'GZIP', 'ZLIB') as tf.data.TFRecordDataset spells it ('' for none)."""
    return '' if compression == 'NONE' else compression


def worker_count(processes=None):
    """The number of worker processes to use: processes, or every usable CPU core if None or 0."""
    if processes:
        return processes
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


@contextlib.contextmanager
def _main_script_not_reimported():
    """Within it, spawned processes do not re-run the main script's imports (onu_train.py's TensorFlow).

    A spawned worker imports the main script's file (as __mp_main__) before running anything; the
    work functions live in library modules, which the worker imports itself, so it needs none of it.
    """
    main = sys.modules.get('__main__')
    main_file = getattr(main, '__file__', None)
    if main_file is None or getattr(main, '__spec__', None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = main_file


@contextlib.contextmanager
def process_pool(processes, initializer=None):
    """A pool of worker processes, or None when a single process is asked for (work runs in the caller)."""
    if processes <= 1:
        yield None
        return
    # 'spawn', not 'fork': callers may already run TensorFlow threads, which do not survive a fork.
    with _main_script_not_reimported():
        pool = multiprocessing.get_context('spawn').Pool(processes, initializer=initializer)
    try:
        yield pool
    finally:
        pool.terminate()  # callers collect every result first; this also stops workers still starting up


def parallel_map(fn, items, pool, window=8):
    """Yields fn(item) for items in order, computed by pool's workers (in this process if pool is None).

    When a result is yielded, the next `window` items are already submitted, and no more: a slow consumer
    never makes the workers fill the RAM.
    """
    if pool is None:
        yield from map(fn, items)
        return
    items = iter(items)
    pending = collections.deque(pool.apply_async(fn, (item,)) for item in itertools.islice(items, window))
    while pending:
        result = pending.popleft().get()
        for item in itertools.islice(items, 1):
            pending.append(pool.apply_async(fn, (item,)))
        yield result
