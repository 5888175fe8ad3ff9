"""What is in a data folder: the one answer, for every layout, built once per script into a DataDir.

    data = describe(data_dir, validation_percent, labels_offset)   # DataError naming the folder and the fix
    data.layout                       # photos, class_folders, records (this repo's), or an onu_layouts name
    data.default_format()             # encoded for photos, else the records' own
    data.has_records('raw')           # readable as they are, or converted first (onu_converter)
    info = data.split('train', 'encoded')       # a DatasetInfo: everything onu_input reads, found here
    with read_errors_as_data_error(info): ...   # the input pipeline's errors as one-line DataErrors

The layouts:
  photos         DATA/train/<class>/*, DATA/val/<class>/*  (class ids = sorted train class-folder names, 0-based;
                 the val folder may also be called validation/ or test/);
  class_folders  PHOTOS/<class>/* with no split: a file is held out for val when the hash of its path relative
                 to PHOTOS falls below --validation_percent (split_of), so adding photos never moves an old one;
  records        this repo's TFRecords: DATA/tfrecords/ (or DATA itself) holding the shards, labels.txt and
                 manifest.json (convert_to_tfrecord.py); for a read-only DATA, the same in the cache folder;
  other tools'   the record layouts of onu_layouts.RECORD_LAYOUTS (the study's, TF-slim's, Inception's, TFDS's).
Photos and bare class folders may have this repo's records beside them (converted once, on demand).

Also this repo's records' manifest, labels.txt, shard names and record keys, and the one line that reports skipped
files (skipped_line). Pure Python, no TensorFlow at import: every script and worker process imports it cheaply.
"""
import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import unicodedata

from onu_lib import onu_errors
from onu_lib import onu_files
from onu_lib import onu_layouts
from onu_lib import onu_photos
from onu_lib import onu_tfrecord
from onu_lib.onu_errors import DataError

DEFAULT_DATA_DIR = '/tmp/onu_data'  # every script's default --data_dir: the built-in sample data
SPLITS = tuple(onu_layouts.SPLIT_NAMES)  # train, val
RECORD_FORMATS = ('raw', 'encoded')
DATA_FORMATS = ('images',) + RECORD_FORMATS
COMPRESSIONS = onu_tfrecord.COMPRESSIONS
DEFAULT_VALIDATION_PERCENT = 10.0  # class folders without a split: the share of photos held out for val

# The layouts besides other tools' (onu_layouts.LAYOUT_NAMES).
PHOTOS = 'photos'
CLASS_FOLDERS = 'class_folders'
RECORDS = 'records'

RECORDS_SUBDIR = 'tfrecords'
LABELS_FILENAME = 'labels.txt'
MANIFEST_FILENAME = 'manifest.json'
MANIFEST_VERSION = 1

# This repo's record keys (TF-slim's), also what most other tools write.
KEY_ENCODED = 'image/encoded'
KEY_RAW = 'image/raw'
KEY_FORMAT = 'image/format'
KEY_LABEL = 'image/class/label'
KEY_TEXT = 'image/class/text'
KEY_HEIGHT = 'image/height'
KEY_WIDTH = 'image/width'
KEY_CHANNELS = 'image/channels'
KEY_FILENAME = 'image/filename'
# The image key of this repo's records of each format.
IMAGE_KEYS = {'raw': KEY_RAW, 'encoded': KEY_ENCODED}

# Values of KEY_FORMAT: what the payload bytes are.
PAYLOAD_JPEG = 'jpeg'
PAYLOAD_PNG = 'png'
PAYLOAD_RAW = 'raw'
CHANNELS = 3
# A record that names no file is named <shard file>#<index> (its position in the shard, from 0).
RECORD_NAME_SEPARATOR = '#'
# The first value of the message of the error a record's label outside the classes raises (onu_input's check).
LABEL_OUT_OF_RANGE = 'label outside the classes:'
# What TensorFlow's messages say of a record whose keys or values are not those of the first record.
UNREADABLE_RECORD_SIGNS = ('is required but could not be found', 'Could not parse', 'Can\'t parse',
                           'Input to reshape')


def _check_choice(name, value, choices):
    """Raises ValueError unless value is one of choices."""
    if value not in choices:
        raise ValueError(f'{name}={value!r}; expected one of {", ".join(choices)}')


def convert_command(data_dir, data_format, *switches, **flag_values):
    """Returns the command line that writes data_format records of data_dir, quoted for the shell."""
    return onu_errors.shell_command('convert_to_tfrecord.py', *switches, data_dir=data_dir, format=data_format,
                                    **flag_values)


def missing_data_dir_error(data_dir):
    """The DataError for a --data_dir that does not exist: how to make sample data, where to point instead."""
    return DataError(f'{data_dir}: data dir not found; make sample data with '
                     f'{onu_errors.shell_command("make_sample_data.py", data_dir=data_dir)}, or point --data_dir '
                     f'at your photos or records (README "Bring your own data")')


# ----------------------------------------------------------------------------------------------
# Photo folders

def visible_subdirs(entries):
    """Sorted names of the non-hidden subfolders among a folder's entries (os.scandir): the class folders of a split."""
    return sorted(entry.name for entry in entries if entry.is_dir() and not onu_photos.is_hidden(entry.name))


def _candidate_files(class_dir):
    """(path, skip reason or None) for every entry of a class folder, sorted by path."""
    for entry in sorted(os.scandir(class_dir), key=lambda e: e.name):
        if onu_photos.is_hidden(entry.name):
            yield entry.path, onu_photos.REASON_HIDDEN
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
                onu_photos.read_image_info(path)
                return True
            except onu_photos.UnreadableImage:
                pass
    return False


def has_split_folders(data_dir):
    """True if data_dir keeps its photos in split folders (train/<class>/), False for bare class folders."""
    return os.path.isdir(os.path.join(data_dir, 'train'))


def split_dir(data_dir, split):
    """The folder of split's photos: data_dir/train, or the first of data_dir/{val,validation,test} there is."""
    names = onu_layouts.SPLIT_NAMES[split]
    for name in names:
        if os.path.isdir(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    return os.path.join(data_dir, names[0])


def bare_class_folders(entries):
    """The visible subfolders but tfrecords/ among data_dir's entries (os.scandir): bare class folders' classes."""
    return [name for name in visible_subdirs(entries) if name != RECORDS_SUBDIR]


def split_of(relative_path, validation_percent):
    """'val' or 'train': the split of a photo of bare class folders, from a hash of its path relative to the folder."""
    name = unicodedata.normalize('NFC', relative_path)  # macOS spells accents decomposed
    position = int.from_bytes(hashlib.sha256(name.encode('utf-8')).digest()[:8], 'big') * 100.0 / 2 ** 64
    return 'val' if position < validation_percent else 'train'


def relative_name(path, data_dir):
    """path relative to data_dir with '/' separators, as stored in image/filename and the manifest."""
    return os.path.relpath(path, data_dir).replace(os.sep, '/')


def _check_has_readable_images(class_dirs, where):
    """DataError naming the first class folder without a usable image."""
    for class_dir in class_dirs:
        if not _has_readable_image(class_dir):
            raise DataError(f'{class_dir} has no readable images: add photos to it, '
                            f'or remove class {os.path.basename(class_dir)!r} from {where}')


def find_class_names(data_dir):
    """Sorted class-folder names (class id = index) of data_dir/train, or of bare class folders; DataError if none."""
    if not has_split_folders(data_dir):
        class_names = bare_class_folders(os.scandir(data_dir)) if os.path.isdir(data_dir) else []
        if not class_names:
            make = onu_errors.shell_command('make_sample_data.py', data_dir=data_dir)
            raise DataError(f'{data_dir}: no photos found: put them in {data_dir}/<class>/ (or {data_dir}/train/<class>/ '
                            f'and {data_dir}/val/<class>/), or run {make}')
        _check_has_readable_images([os.path.join(data_dir, name) for name in class_names], data_dir)
        return class_names
    train_dir = os.path.join(data_dir, 'train')
    class_names = visible_subdirs(os.scandir(train_dir))
    if not class_names:
        raise DataError(f'{train_dir} has no class folders: put each class\'s photos in {train_dir}/<class>/')
    split_dirs = [train_dir]
    val_dir = split_dir(data_dir, 'val')
    if os.path.isdir(val_dir):
        val_names = visible_subdirs(os.scandir(val_dir))
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
    """(ImageInfos sorted by (label, path), (path, reason) pairs of skipped files) of one split."""
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
                    images.append(onu_photos.read_image_info(path, label, class_name))
                    continue
                except onu_photos.UnreadableImage as error:
                    reason = str(error)
            skipped.append((path, reason))
    return images, skipped


def photo_folders(data_dir):
    """The class folders of data_dir's photos: <split>/<class>/ of each split folder, or <class>/ of bare ones."""
    if not has_split_folders(data_dir):
        return [os.path.join(data_dir, name) for name in bare_class_folders(os.scandir(data_dir))]
    folders = []
    for split in SPLITS:
        folder = split_dir(data_dir, split)
        if os.path.isdir(folder):
            folders += [os.path.join(folder, name) for name in visible_subdirs(os.scandir(folder))]
    return folders


# ----------------------------------------------------------------------------------------------
# Skipped files: one line for every way in (training on photos, conversion), counted by kind of reason

def skipped_line(reasons, total, full_list):
    """The one line that reports skipped files: how many of the total looked at, counted by the kind of their
    reason (its words before ':' or '('), and where the full list is."""
    kinds = collections.Counter(re.split(r'[:(]', reason, maxsplit=1)[0].strip() for reason in reasons)
    counts = ', '.join(f'{count} {kind}' + ('s' if count > 1 and kind.endswith(('file', 'folder')) else '')
                       for kind, count in sorted(kinds.items()))
    return f'skipped {len(reasons)} of {total} files: {counts}; the list: {full_list}'


def _write_skipped_list(data_dir, split, skipped):
    """Writes split's skipped (path, reason) pairs to a file in the cache; returns its path, or why it was not."""
    path = os.path.join(onu_files.cache_dir(), 'skipped', f'{onu_files.folder_key(data_dir)}-{split}.txt')
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        onu_files.write_text_atomic(path, ''.join(f'{photo}: {reason}\n' for photo, reason in skipped))
    except OSError as error:
        return f'not written ({error})'
    return path


# ----------------------------------------------------------------------------------------------
# This repo's records on disk: where they are, their manifest and labels file

def cached_records_dir(data_dir):
    """Where this repo's records of a read-only data_dir go: a folder of its own in the cache."""
    return os.path.join(onu_files.cache_dir(), 'records', onu_files.folder_key(data_dir))


def records_dirs(data_dir):
    """The folders holding a manifest of data_dir's records, in order: data_dir, data_dir/tfrecords, the cache's."""
    return [candidate for candidate in (data_dir, os.path.join(data_dir, RECORDS_SUBDIR), cached_records_dir(data_dir))
            if os.path.isfile(os.path.join(candidate, MANIFEST_FILENAME))]


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


def shard_filename(split, record_format, index, num_shards):
    """The file name of one shard inside the records directory."""
    return f'{split}-{record_format}-{index:05d}-of-{num_shards:05d}.tfrecord'


def write_labels(path, class_names):
    """Writes TF-slim's labels file: one 'id:name' line per class."""
    onu_files.write_text_atomic(path, ''.join(f'{label}:{name}\n' for label, name in enumerate(class_names)))


def read_labels(path):
    """The class names of this repo's labels file: TF-slim's id:name lines, ids 0, 1, 2, ... in order."""
    form, names = onu_layouts.read_names_file(path)
    lines = [f'{label}:{name}' for label, name in names.items()] if form == 'ids' else names
    for expected_id, line in enumerate(lines):
        label, _, name = line.partition(':')
        if label != str(expected_id) or not name.strip():
            raise DataError(f'{path}: line {expected_id + 1} is {line!r}, expected "{expected_id}:<class name>": '
                            f'fix the file or re-run python convert_to_tfrecord.py --overwrite')
    return [line.partition(':')[2].strip() for line in lines]


def write_manifest(records_dir, manifest):
    """Writes records_dir/manifest.json atomically."""
    onu_files.write_text_atomic(os.path.join(records_dir, MANIFEST_FILENAME),
                                json.dumps(manifest, indent=1, ensure_ascii=False) + '\n')


def read_manifest(records_dir):
    """The manifest dict written by convert_to_tfrecord.py in records_dir."""
    path = os.path.join(records_dir, MANIFEST_FILENAME)
    command = onu_errors.shell_command('convert_to_tfrecord.py', output_dir=records_dir, data_dir='<your photo folder>')
    fix = f'run {command}'
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
        command = onu_errors.shell_command('convert_to_tfrecord.py', output_dir=records_dir, format=record_format,
                                           data_dir='<your photo folder>')
        raise DataError(f'{records_dir} has no {record_format} records of {split}: run {command}')
    return entry


def shard_paths(records_dir, manifest, split, record_format):
    """Full paths of the shards of one split and record format, in order."""
    entry = records_entry(manifest, split, record_format, records_dir)
    return [os.path.join(records_dir, shard['file']) for shard in entry['shards']]


def tf_compression_type(compression):
    """A manifest's compression ('NONE', 'GZIP', 'ZLIB') as tf.data.TFRecordDataset spells it ('' for none)."""
    return '' if compression == 'NONE' else compression


# ----------------------------------------------------------------------------------------------
# What one split in one data format holds: what onu_input reads

@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What one split in one data format holds: classes, example count, the files to read and how."""
    data_dir: str
    data_format: str
    split: str
    class_names: tuple
    num_examples: int
    files: tuple                 # record shards, or image files in images mode
    layout: str = PHOTOS         # photos, class_folders, records (this repo's), or an onu_layouts name
    names: tuple = ()            # images mode: each file's name relative to data_dir (KEY_FILENAME's form)
    labels: tuple = ()           # images mode: the class id of each file
    orientations: tuple = ()     # images mode: the EXIF orientation (1-8) of each file
    records_per_file: tuple = ()  # record modes: the count of each shard
    compression_type: str = ''   # record modes: as TFRecordDataset spells it ('' for none)
    bytes_per_example: int = 0   # record modes: average record size, sizes the shuffle buffer
    skipped: tuple = ()          # images mode: (path, reason) of files left out when listing
    image_key: str = ''          # record modes: the feature holding the image (raw pixels or encoded bytes)
    label_key: str = KEY_LABEL
    filename_key: str = KEY_FILENAME  # '' when the records name no file
    height_key: str = KEY_HEIGHT  # raw records: the keys of the pixels' height and width
    width_key: str = KEY_WIDTH
    labels_offset: int = 0       # record modes: class = stored label - labels_offset
    # Other tools' records, read as they are or converted: the --labels_offset their labels were read with.
    data_labels_offset: int = None
    validation_percent: float = None  # class_folders: the share held out for val (split_of)

    @property
    def num_classes(self):
        """Returns the number of classes."""
        return len(self.class_names)

    @property
    def record_name_prefixes(self):
        """Returns '<shard file>#' of each shard: a record that names no file is named that and its index."""
        return tuple(os.path.basename(path) + RECORD_NAME_SEPARATOR for path in self.files)


# ----------------------------------------------------------------------------------------------
# The data folder: found once

@dataclasses.dataclass(frozen=True)
class DataDir:
    """What a data folder holds (describe): its layout and records, and the split and labels offset asked for."""
    path: str
    layout: str
    validation_percent: float         # bare class folders: the share held out for val
    labels_offset: object             # other tools' records: the offset asked (None: from evidence)
    manifests: tuple = ()             # ((records dir, manifest), ...) of this repo's records, in records_dirs' order
    foreign: object = None            # onu_layouts.ForeignRecords, or None

    @property
    def has_photos(self):
        """True when the folder holds photos (split folders or bare class folders), not only records."""
        return self.layout in (PHOTOS, CLASS_FOLDERS)

    def _repo_formats(self):
        """The record formats this repo's records hold for every split, in RECORD_FORMATS' order."""
        formats = set()
        for _, manifest in self.manifests:
            splits = manifest.get('splits', {})
            formats.update(fmt for fmt in RECORD_FORMATS
                           if splits and all(fmt in formats_of_split for formats_of_split in splits.values()))
        return tuple(fmt for fmt in RECORD_FORMATS if fmt in formats)

    def records_dir(self, data_format=None):
        """The first records folder whose manifest lists data_format (None: any); data_dir/tfrecords if none does."""
        for records_dir, manifest in self.manifests:
            if data_format is None or any(data_format in formats for formats in manifest.get('splits', {}).values()):
                return records_dir
        return os.path.join(self.path, RECORDS_SUBDIR)

    def _manifest(self, data_format):
        """The manifest of this repo's data_format records ({} if there is none)."""
        records_dir = self.records_dir(data_format)
        return dict(self.manifests).get(records_dir, {})

    def made_otherwise(self, data_format):
        """Why this repo's data_format records do not fit the split or labels offset asked, or None."""
        records_dir, manifest = self.records_dir(data_format), self._manifest(data_format)
        split_by = manifest.get('validation_percent')
        if split_by is not None and split_by != self.validation_percent:
            return (f'{records_dir}: records split with --validation_percent={split_by:g}, but '
                    f'{self.validation_percent:g} is asked; use --validation_percent={split_by:g}, or re-create them '
                    f'with {self.convert_command(data_format, validation_percent=f"{self.validation_percent:g}")}')
        offset = manifest.get('source', {}).get('labels_offset')
        if self.labels_offset is not None and offset is not None and offset != self.labels_offset:
            return (f'{records_dir}: records made with --labels_offset={offset}, but {self.labels_offset} is asked; '
                    f'use --labels_offset={offset}, or re-create them with '
                    f'{self.convert_command(data_format, labels_offset=self.labels_offset)}')
        return None

    def reads_other_tools_records(self, data_format):
        """True when data_format is read from records another tool wrote here (none of this repo's)."""
        return data_format != 'images' and data_format not in self._repo_formats() and self.foreign is not None

    def has_records(self, data_format):
        """True when data_format records can be read as they are: this repo's (every split, made with the split and
        labels offset asked), or another tool's."""
        if data_format in self._repo_formats():
            return self.made_otherwise(data_format) is None
        return self.foreign is not None and data_format in self.foreign.data_formats

    @property
    def record_formats(self):
        """The record formats the folder has to read, this repo's or another tool's: encoded, then raw."""
        formats = set(self._repo_formats()) | set(self.foreign.data_formats if self.foreign else ())
        return tuple(fmt for fmt in ('encoded', 'raw') if fmt in formats)

    def default_format(self):
        """The data format to read when none is asked: encoded for photos, else the records' own (encoded first)."""
        if self.has_photos:
            return 'encoded'
        return (self.record_formats or ('encoded',))[0]

    def convert_command(self, data_format, *switches, **flag_values):
        """The command line that writes this folder's data_format records, quoted for the shell."""
        return convert_command(self.path, data_format, *switches, **flag_values)

    def labels_line(self):
        """One line on how another tool's records here are labelled ('' for photos and this repo's records)."""
        if self.foreign is None:
            return ''
        labels = self.foreign.labels(self.labels_offset)
        return (f'{self.foreign.describe()}; labels start at {labels.offset} ({labels.evidence}); '
                f'class names from {labels.names_from}')

    def photo_class_names(self):
        """The class names of the folder's photos (sorted class-folder names); DataError when it has none."""
        return find_class_names(self.path)

    def photo_splits(self):
        """The splits the folder has photos of: those with a folder, or both for bare class folders (split_of)."""
        return [split for split in SPLITS if self.layout == CLASS_FOLDERS or os.path.isdir(split_dir(self.path, split))]

    def source_paths(self):
        """Paths of what conversion reads, sorted: other tools' files, or the class folders and their entries."""
        if self.foreign is not None:
            return self.foreign.source_paths()
        paths = []
        for class_dir in photo_folders(self.path):
            paths += [class_dir] + sorted(entry.path for entry in os.scandir(class_dir))
        return paths

    def split(self, split, data_format):
        """Returns the DatasetInfo of one split in one data format; DataError naming the path and the fix."""
        _check_choice('data_format', data_format, DATA_FORMATS)
        _check_choice('split', split, SPLITS)
        if data_format == 'images':
            return self._images_info(split)
        if self.reads_other_tools_records(data_format):
            return self._other_tools_records_info(split, data_format)
        return self._records_info(split, data_format)

    def _images_info(self, split):
        """The DatasetInfo of split read from the class folders (split folders, or split_of's for bare ones)."""
        if not self.has_photos:
            raise DataError(f'{self.path}: holds records, not photo folders: read them with '
                            f'--data_format={self.default_format()}')
        class_names = self.photo_class_names()
        bare = self.layout == CLASS_FOLDERS
        folder = self.path if bare else split_dir(self.path, split)
        if not os.path.isdir(folder):
            raise DataError(f'{folder}: no {split} photos; put them in {folder}/<class>/ '
                            f'with the classes of {os.path.join(self.path, "train")}')
        listed, skipped = list_split_images(self.path, split, class_names, self.validation_percent)
        total = len(listed) + len(skipped)
        images = [image for image in listed if onu_photos.tensorflow_decodes(image)]
        skipped += [(image.path, f'{image.image_format} file (--data_format=images cannot decode it; encoded and raw '
                                 f'records include it: {self.convert_command("encoded")})')
                    for image in listed if not onu_photos.tensorflow_decodes(image)]
        if skipped:
            print(skipped_line([reason for _, reason in skipped], total,
                               _write_skipped_list(self.path, split, skipped)), flush=True)
        if not images:
            if bare:
                raise DataError(
                    f'{self.path}: no {split} photos among its class folders with --validation_percent='
                    f'{self.validation_percent:g}; add photos or choose another --validation_percent')
            raise DataError(f'{folder}: no readable images in the class folders; add photos to {folder}/<class>/')
        return DatasetInfo(
            data_dir=self.path, data_format='images', split=split, class_names=tuple(class_names),
            num_examples=len(images), files=tuple(image.path for image in images), layout=self.layout,
            names=tuple(relative_name(image.path, self.path) for image in images),
            labels=tuple(image.label for image in images), orientations=tuple(image.orientation for image in images),
            skipped=tuple(skipped), validation_percent=self.validation_percent if bare else None)

    def _records_info(self, split, data_format):
        """The DatasetInfo of split from this repo's records manifest, checking the shards on disk."""
        records_dir = self.records_dir(data_format)
        manifest = self._manifest(data_format)
        if not manifest:
            raise DataError(f'{os.path.join(records_dir, MANIFEST_FILENAME)} not found: no {data_format} records; '
                            f'write them with {self.convert_command(data_format)}, or use --data_format=images')
        problem = self.made_otherwise(data_format)
        if problem:
            raise DataError(problem)
        formats = manifest.get('splits', {}).get(split, {})
        if data_format not in formats:
            others = [fmt for fmt in RECORD_FORMATS if fmt in formats]
            found = f'only {" and ".join(others)} records' if others else 'no records'
            instead = f', or use --data_format={others[0]}' if others else ''
            raise DataError(f'{records_dir}: {data_format} records of {split} were asked but the manifest lists '
                            f'{found}; write them with {self.convert_command(data_format)}{instead}')
        entry = records_entry(manifest, split, data_format, records_dir)
        files = shard_paths(records_dir, manifest, split, data_format)
        for path, shard in zip(files, entry['shards']):
            self._check_shard(path, shard.get('bytes'), data_format)
        labels_path = os.path.join(records_dir, LABELS_FILENAME)
        if not os.path.isfile(labels_path):
            raise DataError(f'{labels_path} not found: re-create the records with '
                            f'{self.convert_command(data_format, "overwrite")}')
        num_examples = int(entry['records'])
        if not num_examples:
            raise DataError(f'{records_dir}: the manifest lists no {data_format} records of {split}; add photos to '
                            f'{os.path.join(self.path, split)}/<class>/ and run '
                            f'{self.convert_command(data_format, "overwrite")}')
        return DatasetInfo(
            data_dir=self.path, data_format=data_format, split=split, class_names=tuple(read_labels(labels_path)),
            num_examples=num_examples, files=tuple(files), layout=RECORDS,
            records_per_file=tuple(int(shard['records']) for shard in entry['shards']),
            compression_type=tf_compression_type(manifest.get('compression', 'NONE')),
            bytes_per_example=int(entry.get('record_bytes', 0)) // max(num_examples, 1),
            image_key=IMAGE_KEYS[data_format], validation_percent=manifest.get('validation_percent'),
            data_labels_offset=manifest.get('source', {}).get('labels_offset'))

    def _check_shard(self, path, expected_bytes, data_format):
        """Raises DataError when a shard listed in the manifest is missing or has another size."""
        fix = f're-create the records with {self.convert_command(data_format, "overwrite")}'
        if not os.path.isfile(path):
            raise DataError(f'{path}: record file listed in the manifest is missing; {fix}')
        size = os.path.getsize(path)
        if expected_bytes is not None and size != expected_bytes:
            raise DataError(f'{path}: {size} bytes on disk but {expected_bytes} in the manifest (truncated or '
                            f'changed); {fix}')

    def _other_tools_records_info(self, split, data_format):
        """The DatasetInfo of split from the records another tool wrote here (onu_layouts), read as they are."""
        record_set = self.foreign.record_set(split, data_format, self.labels_offset)
        if not record_set.num_examples:
            raise DataError(f'{record_set.folder}: its {split} records are empty')
        layout = record_set.layout
        return DatasetInfo(
            data_dir=self.path, data_format=data_format, split=split, class_names=record_set.labels.class_names,
            num_examples=record_set.num_examples, files=record_set.files, layout=layout.name,
            records_per_file=record_set.records_per_file,
            compression_type=tf_compression_type(record_set.compression),
            bytes_per_example=record_set.record_bytes // record_set.num_examples, image_key=record_set.image_key,
            label_key=layout.label_key, filename_key=record_set.filename_key, height_key=layout.height_key,
            width_key=layout.width_key, labels_offset=record_set.labels.offset,
            data_labels_offset=record_set.labels.offset)


def describe(data_dir, validation_percent=None, labels_offset=None):
    """Returns the DataDir of data_dir, found once; DataError when it holds nothing known. validation_percent None:
    DEFAULT_VALIDATION_PERCENT; labels_offset (other tools' records) None: from evidence."""
    if not os.path.isdir(data_dir):
        raise missing_data_dir_error(data_dir)
    validation_percent = DEFAULT_VALIDATION_PERCENT if validation_percent is None else validation_percent
    manifests = tuple((records_dir, read_manifest(records_dir)) for records_dir in records_dirs(data_dir))
    split_folders = has_split_folders(data_dir)
    entries = [] if split_folders else list(os.scandir(data_dir))  # listed once, read by every layout's check
    foreign = None if split_folders else onu_layouts.find_foreign_records(data_dir, entries)
    if split_folders:
        layout = PHOTOS
    elif foreign is not None:
        layout = foreign.layout.name
    elif bare_class_folders(entries):
        layout = CLASS_FOLDERS
    elif manifests:
        layout = RECORDS
    else:
        raise DataError(
            f'{data_dir}: no data found; looked for photos in train/<class>/ and val/<class>/ or in <class>/ folders, '
            f'this repo\'s records (manifest.json, from convert_to_tfrecord.py), and the records of other tools: '
            f'{onu_layouts.looked_for()}; see README "Bring your own data"')
    return DataDir(path=data_dir, layout=layout, validation_percent=validation_percent, labels_offset=labels_offset,
                   manifests=manifests, foreign=foreign)


# ----------------------------------------------------------------------------------------------
# The input pipeline's errors, said in one line naming the file and the fix

def _last_line(message):
    """Returns the last non-empty line of a TensorFlow error message, minus node annotations."""
    lines = [line.strip() for line in str(message).splitlines()
             if line.strip() and not line.strip().startswith('[[')]
    return lines[-1] if lines else str(message).strip()


def find_damaged_shards(info):
    """Returns [(shard, problem)] for the shards of info whose records are damaged or number other than listed."""
    damaged = []
    for shard, expected in zip(info.files, info.records_per_file):
        compression = info.compression_type or 'NONE'
        framing = onu_tfrecord.read_framing(shard, compression, verify=True)
        if framing.problem:
            damaged.append((shard, framing.problem))
        elif framing.records != expected:
            damaged.append((shard, f'{framing.records} records but {expected} listed'))
    return damaged


def _asserted_number(sign, message):
    """Returns the number an error of onu_input's check starting with sign holds, or None for another error."""
    match = re.search(re.escape(sign) + r'\]\s*\[(-?\d+)\]', str(message))
    return int(match.group(1)) if match else None


def _first_undecodable(paths):
    """The first of paths that TensorFlow cannot read or decode, or None. Its decode errors name no file, so after
    one the photos are decoded again one by one (only then: the pipeline itself pays nothing for it)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        path = tf.compat.v1.placeholder(tf.string, [])
        decoded = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        with tf.compat.v1.Session() as session:
            for candidate in paths:
                try:
                    session.run(decoded, {path: candidate})
                except tf.errors.OpError:
                    return candidate
    return None


def _translated(info, error):
    """Returns the DataError that says in one line what a TensorFlow error of reading info means, or None."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (only processes that read with it get here)
    message = getattr(error, 'message', str(error))
    if isinstance(error, tf.errors.DataLossError) and info.data_format != 'images':
        damaged = find_damaged_shards(info)
        where, problem = damaged[0] if damaged else (os.path.dirname(info.files[0]), _last_line(message))
        fix = (f're-create the records with {convert_command(info.data_dir, info.data_format, "overwrite")}'
               if info.layout == RECORDS else 're-create it with the tool that wrote it, or move it away')
        return DataError(f'{where}: damaged {info.data_format} record file ({problem}); {fix}')
    if isinstance(error, tf.errors.InvalidArgumentError):
        label = _asserted_number(LABEL_OUT_OF_RANGE, message)
        path = _first_undecodable(info.files) if info.data_format == 'images' else None
        if path:
            return DataError(f'{path}: {onu_photos.why_undecodable(path)}; fix or remove it, then start again')
        if label is not None:
            return DataError(
                f'{info.data_dir}: a record of {info.split} has label {label}, not one of the {info.num_classes} '
                f'classes {info.labels_offset}..{info.labels_offset + info.num_classes - 1} (labels offset '
                f'{info.labels_offset}); pass the --labels_offset the records use')
        if info.data_format != 'images' and any(sign in message for sign in UNREADABLE_RECORD_SIGNS):
            return DataError(
                f'{os.path.dirname(info.files[0])}: a {info.split} record lacks what the first one holds '
                f'({_last_line(message)}); every record needs {info.image_key} and {info.label_key}: re-create the '
                f'records, or move the odd file away')
    return None


@contextlib.contextmanager
def read_errors_as_data_error(info):
    """Re-raises the data errors of running onu_input's pipelines of info (damaged records, labels outside the
    classes, records without the first one's keys, photos that do not decode) as one-line DataErrors."""
    try:
        yield
    except Exception as error:  # TensorFlow's errors: the caller's process has imported it
        translated = _translated(info, error) if type(error).__module__.startswith('tensorflow') else None
        if translated is None:
            raise
        raise translated from None
