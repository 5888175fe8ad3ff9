"""TFRecords that other tools wrote, read as they are: the registry of their layouts, which one a folder holds
(found from its file names and first record), and its splits, keys, label offset, class names and epoch sizes.

    records = find_foreign_records(data_dir, list(os.scandir(data_dir)))   # ForeignRecords, or None if none
    record_set = records.record_set('train', 'encoded', labels_offset=None)   # a RecordSet, for onu_dataset

Only onu_dataset asks. A layout is one RecordLayout entry of RECORD_LAYOUTS (file names, record keys, label
convention, where class names and epoch sizes are); finding, messages and the tests iterate the list, and entries
whose files match each other's patterns are refused at import, so the list's order never matters. Found, not assumed:
  - the image key (raw pixels or encoded bytes) and the label key, from the first record;
  - the label offset (TF-slim's 0:background, Inception's 1-based labels), only from evidence: a labels file, the
    records' class texts, or a converter's keys; never from the smallest label seen (a split may lack class 0);
  - class names: the names file, or image/class/text; without any, class_<label>;
  - epoch sizes: the tool's counts file (TFDS's dataset_info.json), else counted once from the record framing and
    cached outside the data folder (onu_files.cache_dir()), keyed by path, size and modification time.
Pure Python, no TensorFlow.
"""
import dataclasses
import json
import os
import re
import typing

from onu_lib import onu_files
from onu_lib import onu_photos
from onu_lib import onu_tfrecord
from onu_lib.onu_errors import DataError

# The splits, and the names each goes by in folder and file names, in order of preference ('test' only when no
# 'val'): other tools' file names, and the split folders of photos (onu_dataset).
SPLIT_NAMES = {'train': ('train',), 'val': ('val', 'validation', 'test')}
SPLIT_TOKENS = '|'.join(name for names in SPLIT_NAMES.values() for name in names)
SCAN_MAX_BYTES = 4096  # scans read values up to this size (labels, texts, sizes); image bytes are skipped
INDEX_SUBDIR = 'record-index'  # in onu_files.cache_dir(): one JSON file of counts per record folder
BACKGROUND = 'background'  # TF-slim's ImageNet labels.txt names class 0 so; no example has it
NAMES_FORMS = ('ids', 'lines')  # a names file of id:name lines, or of one name per line
SHARD_NUMBERS = r'\d{5}-of-\d{5}'
# The keys and labels file TF-slim's converters write (datasets/dataset_utils.py); the other tools here share them.
SLIM_ENCODED, SLIM_LABEL, SLIM_HEIGHT, SLIM_WIDTH = 'image/encoded', 'image/class/label', 'image/height', 'image/width'
SLIM_FORMAT, SLIM_TEXT, SLIM_FILENAME, SLIM_LABELS_FILE = 'image/format', 'image/class/text', 'image/filename', 'labels.txt'
# Raw pixels of other tools' records (PIL's tobytes of the photo as opened): bytes per pixel -> Pillow mode.
# All become RGB as the photos would: grey replicated, alpha dropped.
RAW_MODES = {1: 'L', 3: 'RGB', 4: 'RGBA'}


@dataclasses.dataclass(frozen=True)
class CountsFile:
    """A file of a tool's own beside its records that lists the records per shard of each split."""
    name: str
    read: typing.Callable    # read(path, split token, number of files) -> records per file, or None
    write: typing.Callable   # write(path, {split token: [records per file]}): what the tool writes (the tests')


def _read_tfds_info(path, split_token, num_files):
    """The records per shard of a TFDS split from its dataset_info.json, or None if it does not list them."""
    try:
        with open(path, encoding='utf-8') as f:
            info = json.load(f)
        for split in info.get('splits', []):
            if split.get('name') == split_token:
                lengths = [int(length) for length in split.get('shardLengths', [])]
                return tuple(lengths) if len(lengths) == num_files else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return None


def _write_tfds_info(path, shard_lengths):
    """Writes a dataset_info.json as TFDS does, listing each split's shard lengths."""
    splits = [{'name': token, 'shardLengths': [str(length) for length in lengths],
               'filepathTemplate': '{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}'}
              for token, lengths in shard_lengths.items()]
    onu_files.write_text_atomic(path, json.dumps({'splits': splits}) + '\n')


TFDS_INFO = CountsFile('dataset_info.json', _read_tfds_info, _write_tfds_info)


@dataclasses.dataclass(frozen=True)
class RecordLayout:
    """The TFRecords one tool writes: its file names, record keys, label convention, class names and counts."""
    name: str
    looks_like: str             # the file names, for messages
    file_name: re.Pattern       # matches a file of the layout; its group 'split' is one of SPLIT_TOKENS
    sample_file_name: str       # str.format template: {name}, {split} (a token), {index} and {count}, {format}
    split_tokens: dict          # {'train': ..., 'val': ...}: the split tokens the tool writes (any SPLIT_NAMES is found)
    image_keys: dict            # {key: 'encoded' or 'raw', what its bytes are}, in order of preference
    label_key: str
    written_keys: tuple = ()    # the other keys the tool writes (image/height, image/class/text, ...)
    format_tokens: dict = None  # {data format: how the tool's file names spell it}; None: the format's name
    height_key: str = SLIM_HEIGHT  # raw pixels: their height and width
    width_key: str = SLIM_WIDTH
    filename_key: str = SLIM_FILENAME  # the record's file name, when the tool writes one
    text_key: str = SLIM_TEXT          # the record's class name, when the tool writes one
    labels_base: int = None     # the label the tool gives the first class; None: varies, evidence needed
    labels_base_keys: tuple = ()  # keys that show the tool wrote a record: labels_base counts as evidence then
    names_files: tuple = ()     # files beside the records that name the classes, in order of preference
    writes_names_file: bool = True  # the tool itself writes names_files[0] beside its records (else users may)
    names_form: str = 'ids'     # how the names file is written: id:name lines, or one name per line
    first_line_label: int = 0   # the label of line 1 of a names file with one name per line
    counts_file: CountsFile = None  # a file of the tool's own with the records per shard
    version_folder: str = None  # the tool keeps its files in <data_dir>/<version>/ (TFDS), e.g. '3.0.1'

    def __post_init__(self):
        if self.names_form not in NAMES_FORMS:
            raise ValueError(f'layout {self.name}: names_form={self.names_form!r}; expected one of {NAMES_FORMS}')
        if set(self.split_tokens) != set(SPLIT_NAMES):
            raise ValueError(f'layout {self.name}: split_tokens must name a token for each of {tuple(SPLIT_NAMES)}')

    @property
    def sharded(self):
        """True when the tool writes a split as numbered shards, False for one file per split."""
        return '{index' in self.sample_file_name

    def file_name_of(self, split_token, index=0, count=1, data_format='encoded', name='flowers'):
        """The name the tool gives a file of split_token (shard index of count) holding data_format images."""
        format_token = (self.format_tokens or {}).get(data_format, data_format)
        return self.sample_file_name.format(name=name, split=split_token, index=index, count=count, format=format_token)

    def sample_names(self, data_format='encoded'):
        """File names this tool writes for each split (two shards each, when it shards)."""
        count = 2 if self.sharded else 1
        return [self.file_name_of(token, index, count, data_format)
                for token in self.split_tokens.values() for index in range(count)]


def _shards(prefix, suffix=''):
    """A file-name pattern: prefix, a split token, then suffix (with the shard numbers where the tool writes them)."""
    return re.compile(prefix + rf'(?P<split>{SPLIT_TOKENS})' + suffix)


_INCEPTION_KEYS = ('image/colorspace', 'image/channels', SLIM_TEXT)

# The layouts of other tools' records, as their code writes them; the tests write each one's sample files.
RECORD_LAYOUTS = (
    RecordLayout(
        name='tfds', looks_like='TFDS: <name>-train.tfrecord-00000-of-00016 beside dataset_info.json',
        file_name=_shards(r'(?P<name>.+)-', rf'\.tfrecord-{SHARD_NUMBERS}'),
        sample_file_name='{name}-{split}.tfrecord-{index:05d}-of-{count:05d}',
        split_tokens={'train': 'train', 'val': 'test'}, image_keys={'image': 'encoded'}, label_key='label',
        labels_base=0, names_files=('label.labels.txt',), names_form='lines', counts_file=TFDS_INFO,
        version_folder='3.0.1'),
    RecordLayout(
        name='slim', looks_like="TF-slim's converters: <name>_train_00000-of-00005.tfrecord beside labels.txt",
        file_name=_shards(r'(?P<name>.+)_', rf'_{SHARD_NUMBERS}\.tfrecord'),
        sample_file_name='{name}_{split}_{index:05d}-of-{count:05d}.tfrecord',
        split_tokens={'train': 'train', 'val': 'validation'},
        image_keys={SLIM_ENCODED: 'encoded'}, label_key=SLIM_LABEL,
        written_keys=(SLIM_FORMAT, SLIM_HEIGHT, SLIM_WIDTH),
        labels_base=0, names_files=(SLIM_LABELS_FILE,)),
    RecordLayout(
        name='inception', looks_like='the Inception/ImageNet converters: train-00000-of-01024, validation-00000-of-00128',
        file_name=_shards('', f'-{SHARD_NUMBERS}'), sample_file_name='{split}-{index:05d}-of-{count:05d}',
        split_tokens={'train': 'train', 'val': 'validation'},
        image_keys={SLIM_ENCODED: 'encoded'}, label_key=SLIM_LABEL,
        written_keys=(SLIM_HEIGHT, SLIM_WIDTH, SLIM_FORMAT, SLIM_FILENAME) + _INCEPTION_KEYS,
        labels_base=1, labels_base_keys=_INCEPTION_KEYS, names_files=(SLIM_LABELS_FILE,),
        writes_names_file=False, names_form='lines', first_line_label=1),
    RecordLayout(
        name='single_file', looks_like="one file per split: the study's 603_663_train_raw.tfrecord and "
                                       "603_663_val_g.tfrecord, TF-slim's cifar10_train.tfrecord",
        file_name=re.compile(rf'(?!.*{SHARD_NUMBERS})(?:.*?[_.-])?(?P<split>{SPLIT_TOKENS})(?:[_.-].*)?'
                             r'\.(?:tfrecords?|records?)'),
        sample_file_name='603_663_{split}_{format}.tfrecord', split_tokens={'train': 'train', 'val': 'val'},
        format_tokens={'raw': 'raw', 'encoded': 'g'},
        image_keys={'image/raw': 'raw', SLIM_ENCODED: 'encoded'}, label_key=SLIM_LABEL,
        written_keys=(SLIM_HEIGHT, SLIM_WIDTH),
        labels_base=0, names_files=(SLIM_LABELS_FILE,), writes_names_file=False),
)
LAYOUT_NAMES = tuple(layout.name for layout in RECORD_LAYOUTS)


def _check_layouts_exclusive(layouts):
    """ValueError when two layouts share a name, or a layout's sample files match another layout's pattern."""
    names = [layout.name for layout in layouts]
    if len(set(names)) != len(names):
        raise ValueError(f'record layouts share a name: {names}')
    for layout in layouts:
        for data_format in set(layout.image_keys.values()):
            for sample in layout.sample_names(data_format):
                if not layout.file_name.fullmatch(sample):
                    raise ValueError(f'record layout {layout.name}: its sample file {sample} does not match its '
                                     f'own file_name pattern')
                others = [other.name for other in layouts if other is not layout and other.file_name.fullmatch(sample)]
                if others:
                    raise ValueError(f'record layout {layout.name}: its files ({sample}) also match the pattern of '
                                     f'{", ".join(others)}; make the file_name patterns exclusive')


_check_layouts_exclusive(RECORD_LAYOUTS)


def looked_for():
    """What finding records looks for, for a one-line error: every layout's file names."""
    return '; '.join(layout.looks_like for layout in RECORD_LAYOUTS)


def layout_named(name):
    """Returns the entry of RECORD_LAYOUTS called name (a one-line ValueError if there is none)."""
    for layout in RECORD_LAYOUTS:
        if layout.name == name:
            return layout
    raise ValueError(f'unknown record layout {name}; the layouts are {", ".join(LAYOUT_NAMES)}')


# ----------------------------------------------------------------------------------------------
# Finding the files

@dataclasses.dataclass(frozen=True)
class RecordGroup:
    """Files of one split written together (a sharded set, or one single file), and their first record's keys."""
    split: str
    files: tuple            # full paths, in shard order
    compression: str
    features: dict          # {key: onu_tfrecord.Feature} of the first record (image bytes not kept)
    image_key: str
    data_format: str        # 'raw' or 'encoded': what the image bytes of the records are


def _version_folders(entries, layout):
    """The subfolders among a folder's entries holding the layout's counts file (TFDS's <version>/), newest first."""
    def version(entry):
        return tuple(int(part) if part.isdigit() else 0 for part in entry.name.split('.'))
    folders = [entry for entry in entries if entry.is_dir() and not onu_photos.is_hidden(entry.name)
               and os.path.isfile(os.path.join(entry.path, layout.counts_file.name))]
    return [entry.path for entry in sorted(folders, key=version, reverse=True)]


def _matching_files(entries, layout):
    """{file name: split token} of a folder's files (entries: its listing) that layout's pattern matches."""
    matches = {}
    for entry in sorted(entries, key=lambda e: e.name):
        if entry.is_file() and not onu_photos.is_hidden(entry.name):
            match = layout.file_name.fullmatch(entry.name)
            if match:
                matches[entry.name] = match.group('split')
    return matches


def _group_name(file_name):
    """The name shared by the shards of one set: the shard numbers taken out."""
    return re.sub(r'\d{5}-of-(\d{5})', r'#-of-\1', file_name)


def _first_features(paths, compression):
    """{key: Feature} of the first record of the first non-empty file of paths (bytes over 4 KB not kept); None if none."""
    for path in paths:
        payload = onu_tfrecord.first_record(path, compression)
        if payload is not None:
            try:
                return onu_tfrecord.parse_example(payload, max_bytes=SCAN_MAX_BYTES)
            except onu_tfrecord.NotAnExample as error:
                raise DataError(f'{path}: its first record is not a tf.train.Example ({error}); '
                                f'point --data_dir at image records') from None
    return None


def _compression(paths):
    """The one compression of paths ('NONE', 'GZIP', 'ZLIB'); DataError for a file that is not a TFRecord file."""
    found = {}
    for path in paths:
        compression = onu_tfrecord.sniff_compression(path)
        if compression is None:
            raise DataError(f'{path}: not a TFRecord file (neither its framing nor GZIP/ZLIB compression); '
                            f'remove it from the folder or rename it')
        found.setdefault(compression, path)
    if len(found) > 1:
        raise DataError(f'{found[sorted(found)[1]]}: {sorted(found)[1]}-compressed but {found[sorted(found)[0]]} is '
                        f'{sorted(found)[0]}: give the files of one set one compression')
    return next(iter(found), 'NONE')


def _record_group(layout, folder, split, names):
    """The RecordGroup of the files names (one set of one split), or None if they hold no record."""
    paths = tuple(os.path.join(folder, name) for name in names)
    compression = _compression(paths)
    features = _first_features(paths, compression)
    if features is None:
        return None
    image_key = next((key for key in layout.image_keys
                      if key in features and features[key].kind == onu_tfrecord.BYTES), None)
    label = features.get(layout.label_key)
    if image_key is None or label is None or label.kind != onu_tfrecord.INT64:
        wanted = ' or '.join(layout.image_keys) if image_key is None else layout.label_key
        what = 'image bytes' if image_key is None else 'an int64 label'
        raise DataError(f'{paths[0]}: its records hold no {what} under {wanted}, as {layout.name} records do (keys: '
                        f'{", ".join(sorted(features))}); convert your data with a tool that writes them, or point '
                        f'--data_dir elsewhere')
    return RecordGroup(split=split, files=paths, compression=compression, features=features,
                       image_key=image_key, data_format=layout.image_keys[image_key])


def _folder_state(data_dir, entries):
    """What finding records in data_dir depends on: its own and its subfolders' modification times."""
    return tuple((entry.name, entry.stat().st_mtime_ns) for entry in entries if entry.is_dir()) + (
        os.stat(data_dir).st_mtime_ns,)


_found = {}  # (real path, _folder_state) -> ForeignRecords or None, found once per process


def find_foreign_records(data_dir, entries):
    """The ForeignRecords in data_dir (or its newest version folder), or None; entries: data_dir's listing (a list of
    os.scandir's). Found once per process while the folder does not change."""
    key = (os.path.realpath(data_dir), _folder_state(data_dir, entries))
    if key not in _found:
        _found[key] = _find(data_dir, entries)
    return _found[key]


def _layout_files(data_dir, entries):
    """[(layout, folder, {file name: split token})] of every layout whose files data_dir (entries: its listing) holds."""
    listings = {data_dir: entries}  # each folder listed once, however many layouts look in it
    found = []
    for layout in RECORD_LAYOUTS:
        folders = [data_dir] + (_version_folders(entries, layout) if layout.version_folder else [])
        for folder in folders:
            if folder not in listings:
                listings[folder] = list(os.scandir(folder))
            matches = _matching_files(listings[folder], layout)
            if matches:
                found.append((layout, folder, matches))
                break
    return found


def _find(data_dir, entries):
    """The ForeignRecords of the one layout whose files data_dir holds, or None; DataError for files of two."""
    found = _layout_files(data_dir, entries)
    if len(found) > 1:
        examples = '; '.join(f'{layout.name}: {sorted(matches)[0]}' for layout, _, matches in found)
        raise DataError(f'{data_dir}: holds the records of more than one tool ({examples}); keep one set of records '
                        f'per folder')
    if not found:
        return None
    layout, folder, matches = found[0]
    records = ForeignRecords(layout, folder, matches)
    if not records.groups:
        raise DataError(f'{folder}: its {layout.name} files ({", ".join(sorted(matches)[:3])}'
                        f'{", ..." if len(matches) > 3 else ""}) hold no complete record; re-create them '
                        f'with the tool that wrote it')
    return records


# ----------------------------------------------------------------------------------------------
# Counting, cached outside the data folder

def _index_path(folder):
    """The cache file of folder's record counts and scans."""
    return os.path.join(onu_files.cache_dir(), INDEX_SUBDIR, onu_files.folder_key(folder) + '.json')


def _load_index(folder):
    """{file name: entry} cached for folder ({} when there is none or it is unreadable)."""
    try:
        with open(_index_path(folder), encoding='utf-8') as f:
            index = json.load(f)
    except (OSError, ValueError):
        return {}
    files = index.get('files') if isinstance(index, dict) else None
    return files if isinstance(files, dict) and index.get('folder') == os.path.realpath(folder) else {}


class _Index:
    """The cached counts and scans of one folder's record files: looked up by name, size and mtime."""

    def __init__(self, folder):
        self._folder = folder
        self._files = _load_index(folder)
        self._changed = False

    def entry(self, path, compression):
        """The cached entry of path, or a fresh one if it is absent or the file changed."""
        name = os.path.basename(path)
        stat = os.stat(path)
        size, mtime_ns = stat.st_size, stat.st_mtime_ns
        entry = self._files.get(name)
        if not (isinstance(entry, dict) and entry.get('size') == size and entry.get('mtime_ns') == mtime_ns
                and entry.get('compression') == compression):
            entry = self._files[name] = {'size': size, 'mtime_ns': mtime_ns, 'compression': compression}
            self._changed = True
        return entry

    def framing(self, path, compression):
        """(records, problem) of path's framing, counted once."""
        entry = self.entry(path, compression)
        if 'records' not in entry:
            framing = onu_tfrecord.read_framing(path, compression)
            entry.update(records=framing.records, problem=framing.problem)
            self._changed = True
        return entry['records'], entry['problem']

    def scan(self, path, compression, group, layout):
        """{labels: {label: count}, texts: {label: text}, problem} of path's records, scanned once."""
        entry = self.entry(path, compression)
        if 'scan' not in entry:
            entry['scan'] = _scan_file(path, compression, group, layout)
            self._changed = True
        return entry['scan']

    def save(self):
        """Writes what was counted or scanned to the cache (where it cannot be written, counts are made again)."""
        if self._changed:
            path = _index_path(self._folder)
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                onu_files.write_text_atomic(path, json.dumps({'folder': os.path.realpath(self._folder),
                                                              'files': self._files}) + '\n')
            except OSError:
                pass
            self._changed = False


def _raw_pixels_problem(features, image_key, layout):
    """Why a raw record's pixels cannot be an image (byte count against height x width), or None."""
    sizes = [features.get(key) for key in (layout.height_key, layout.width_key)]
    if any(size is None or size.kind != onu_tfrecord.INT64 or not size.values for size in sizes):
        return f'no {layout.height_key} and {layout.width_key}, which raw pixels need'
    height, width = sizes[0].values[0], sizes[1].values[0]
    image = features[image_key]
    num_bytes = image.values[0] if image.skipped else len(image.values[0]) if image.values else 0
    if height <= 0 or width <= 0 or not any(num_bytes == height * width * c for c in RAW_MODES):
        return (f'{num_bytes} bytes of pixels for {height}x{width}, which is not '
                f'{", ".join(str(c) for c in RAW_MODES)} bytes per pixel')
    return None


def _scan_file(path, compression, group, layout):
    """Reads the labels, class texts and (raw records) pixel sizes of every record of path; image bytes skipped."""
    labels, texts, problem = {}, {}, None
    try:
        for index, features in enumerate(onu_tfrecord.scan_examples(path, compression, SCAN_MAX_BYTES)):
            label_feature = features.get(layout.label_key)
            label = label_feature.values[0] if label_feature and label_feature.values else None
            if label is None:
                problem = problem or f'record {index + 1} has no {layout.label_key}'
                continue
            labels[str(label)] = labels.get(str(label), 0) + 1
            text = _text(features, layout)
            if text is not None:
                texts.setdefault(str(label), text)
            if group.data_format == 'raw' and problem is None:
                problem = _raw_pixels_problem(features, group.image_key, layout)
                problem = problem and f'record {index + 1}: {problem}'
    except onu_tfrecord.NotAnExample as error:
        problem = f'{error}: not a tf.train.Example'
    return {'labels': labels, 'texts': texts, 'problem': problem}


# ----------------------------------------------------------------------------------------------
# Labels: the offset from evidence, the class names

_ID_NAME = re.compile(r'(\d+):(.+)')  # a line of TF-slim's labels file


def read_names_file(path):
    """(form, names) of a labels file: ('ids', {id: name}) for id:name lines, ('lines', [name, ...]) otherwise;
    DataError when it is missing or unreadable."""
    try:
        with open(path, encoding='utf-8-sig') as f:  # -sig: a byte-order mark some editors write is not a name
            lines = [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        raise DataError(f'{path} not found: run python convert_to_tfrecord.py to write it') from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f'{path}: unreadable labels file ({error}); save it as UTF-8 text, or move it away') from None
    pairs = [_ID_NAME.fullmatch(line) for line in lines]
    if lines and all(pairs):
        return 'ids', {int(pair.group(1)): pair.group(2).strip() for pair in pairs}
    return 'lines', lines


def _text(features, layout):
    """The class name a record's layout.text_key holds, or None."""
    text = features.get(layout.text_key)
    if text and text.kind == onu_tfrecord.BYTES and text.values and not text.skipped:
        return text.values[0].decode('utf-8', errors='replace')
    return None


@dataclasses.dataclass(frozen=True)
class Labels:
    """How stored labels map to the model's classes: class = label - offset; and why."""
    offset: int
    class_names: tuple
    evidence: str     # where the offset comes from
    names_from: str   # where the class names come from


class ForeignRecords:
    """The records of one RecordLayout found in a folder: their groups by split and format, labels and counts."""

    def __init__(self, layout, folder, matches):
        self.layout = layout
        self.folder = folder
        # split -> the split token its files use (the first of SPLIT_NAMES there is)
        self._tokens = {split: next((name for name in names if name in matches.values()), None)
                        for split, names in SPLIT_NAMES.items()}
        self.groups = []
        for split, token in self._tokens.items():
            if token is None:
                continue
            by_set = {}
            for name, file_token in matches.items():
                if file_token == token:
                    by_set.setdefault(_group_name(name), []).append(name)
            for names in by_set.values():
                group = _record_group(layout, folder, split, sorted(names))
                if group is not None:
                    self.groups.append(group)
        self._labels = {}
        self._index = _Index(folder)

    @property
    def data_formats(self):
        """The data formats the records hold ('encoded' and/or 'raw'), encoded first."""
        found = {group.data_format for group in self.groups}
        return tuple(fmt for fmt in ('encoded', 'raw') if fmt in found)

    def describe(self):
        """One line: the layout and what each split holds."""
        parts = []
        for split in SPLIT_NAMES:
            sets = [f'{len(group.files)} {group.data_format} file(s)'
                    f'{" " + group.compression if group.compression != "NONE" else ""} ({group.image_key})'
                    for group in self.groups if group.split == split]
            if sets:
                parts.append(f'{split} ({self._tokens[split]}): {" + ".join(sets)}')
        return f'{self.folder}: {self.layout.name} records, {"; ".join(parts)}'

    def _groups(self, split, data_format):
        """The groups of split holding data_format; DataError saying what there is when none does."""
        groups = [group for group in self.groups if group.split == split and group.data_format == data_format]
        if groups:
            return groups
        there = sorted({group.data_format for group in self.groups if group.split == split})
        if there:
            raise DataError(f'{self.folder}: its {self.layout.name} records of {split} hold {" and ".join(there)} '
                            f'images, not {data_format}: use --data_format={there[0]}')
        raise DataError(f'{self.folder}: no {split} records among its {self.layout.name} files (looked for the '
                        f'split names {" or ".join(SPLIT_NAMES[split])} in {self.layout.looks_like})')

    def _counts(self, groups):
        """Records per file of groups: TFDS's own counts, else the framing counted once; DataError for a cut file."""
        counts, counts_file = [], self.layout.counts_file
        for group in groups:
            listed = (counts_file.read(os.path.join(self.folder, counts_file.name), self._tokens[group.split],
                                       len(group.files)) if counts_file else None)
            if listed is None:
                listed = [self._check_framing(path, group.compression) for path in group.files]
            counts += listed
        return counts

    def _check_framing(self, path, compression):
        """Returns the records of path, counted once; DataError naming it when it is cut short or damaged."""
        records, problem = self._index.framing(path, compression)
        if problem:
            self._index.save()
            raise DataError(f'{path}: damaged or truncated record file ({problem}); re-create it with the '
                            f'tool that wrote it, or move it out of {self.folder}')
        return records

    def _scans(self, groups=None):
        """The scans of groups' files (default: all): labels, texts, raw sizes, each once and cached."""
        scans = []
        for group in self.groups if groups is None else groups:
            for path in group.files:
                self._check_framing(path, group.compression)
                scan = self._index.scan(path, group.compression, group, self.layout)
                if scan['problem']:
                    self._index.save()
                    raise DataError(f'{path}: {scan["problem"]}; re-create the file, or move it out of '
                                    f'{self.folder}')
                scans.append(scan)
        self._index.save()
        return scans

    def _offset_evidence(self, names_file):
        """(offset, evidence, label of line 1 of a one-name-per-line names file) that the files show; offset None if none."""
        group = self.groups[0]
        label_values = group.features[self.layout.label_key].values
        label = label_values[0] if label_values else None
        text = _text(group.features, self.layout)
        line_one = self.layout.first_line_label
        if names_file is not None:
            path, (form, names) = names_file
            if form == 'ids':
                first = min(names)
                if first == 0 and names[0].lower() == BACKGROUND:
                    return 1, f'{path} names label 0 {BACKGROUND!r}, which no photo has', line_one
                if first in (0, 1):
                    return first, f'{path} numbers the classes from {first}', line_one
            elif text is not None and label is not None:
                matches = [first for first in (0, 1) if 0 <= label - first < len(names) and names[label - first] == text]
                if len(matches) == 1:
                    return matches[0], (f'the first record\'s label {label} is {text!r}, line '
                                        f'{label - matches[0] + 1} of {path}'), matches[0]
            if form == 'lines':
                return line_one, f'{path} is the {self.layout.name} labels file, whose line 1 is label {line_one}', line_one
        if self.layout.labels_base is not None and all(key in group.features for key in self.layout.labels_base_keys):
            keys = f' (keys {", ".join(self.layout.labels_base_keys)})' if self.layout.labels_base_keys else ''
            return self.layout.labels_base, (f'{self.layout.name} records{keys}, whose labels start at '
                                             f'{self.layout.labels_base}'), line_one
        return None, None, line_one

    def _names_file(self):
        """(path, read_names_file(path)) of the first names file beside the records, or None."""
        for name in self.layout.names_files:
            path = os.path.join(self.folder, name)
            if os.path.isfile(path):
                return path, read_names_file(path)
        return None

    def labels(self, labels_offset=None):
        """The Labels of the records: offset from evidence (or labels_offset), class names; DataError without evidence."""
        if labels_offset in self._labels:
            return self._labels[labels_offset]
        names_file = self._names_file()
        offset, evidence, line_one = self._offset_evidence(names_file)
        if labels_offset is not None:
            if offset is not None and offset != labels_offset:
                evidence = f'--labels_offset={labels_offset}, against the evidence ({evidence}: {offset})'
            else:
                evidence = f'--labels_offset={labels_offset}'
            offset = labels_offset
        if offset is None:
            raise DataError(f'{self.folder}: cannot tell whether its {self.layout.name} labels start at 0 or at 1 '
                            f'(no labels file, no class texts, no keys of a known converter): pass '
                            f'--labels_offset=0, or --labels_offset=1 if label 0 is unused (background)')
        self._labels[labels_offset] = self._class_names(names_file, offset, evidence, line_one)
        return self._labels[labels_offset]

    def _class_names(self, names_file, offset, evidence, line_one):
        """The Labels with class names from the names file (line_one: the label of its line 1 when it has one name a
        line), else the records' texts, else class_<label>."""
        if names_file is not None:
            path, (form, names) = names_file
            if form == 'ids':  # placed by id: a gap in the ids is a class without a name
                ordered = [names.get(label, f'class_{label}') for label in range(offset, max(names) + 1)]
            elif offset >= line_one:
                ordered = names[offset - line_one:]
            else:
                ordered = [f'class_{label}' for label in range(offset, line_one)] + names
            return Labels(offset, tuple(ordered), evidence, path)
        labels, texts = set(), {}
        for scan in self._scans():
            labels.update(int(label) for label in scan['labels'])
            for label, text in scan['texts'].items():
                texts.setdefault(int(label), text)
        if not labels:
            raise DataError(f'{self.folder}: its {self.layout.name} records hold no labels')
        if min(labels) < offset:
            raise DataError(f'{self.folder}: a record has label {min(labels)}, below the label offset {offset} '
                            f'({evidence}); pass --labels_offset={min(labels)} if its labels start there')
        names = tuple(texts.get(label, f'class_{label}') for label in range(offset, max(labels) + 1))
        names_from = 'image/class/text' if texts else 'the labels seen (class_<label>: no labels file, no class texts)'
        return Labels(offset, names, evidence, names_from)

    def record_set(self, split, data_format, labels_offset=None):
        """The RecordSet of split in data_format (counted, labels resolved, raw pixels checked); DataError if none."""
        groups = self._groups(split, data_format)
        keys = {group.image_key for group in groups}
        if len(keys) > 1:
            raise DataError(f'{self.folder}: the {split} {data_format} files hold their images under different keys '
                            f'({" and ".join(sorted(keys))}): keep one set of files per split')
        counts = self._counts(groups)
        labels = self.labels(labels_offset)
        if data_format == 'raw':
            self._scans(groups)
        self._index.save()
        files = tuple(path for group in groups for path in group.files)
        compressions = {group.compression for group in groups}
        if len(compressions) > 1:
            raise DataError(f'{self.folder}: the {split} {data_format} files mix {" and ".join(sorted(compressions))} '
                            f'compression: keep one set of files per split')
        first = groups[0]
        names_files = first.features.get(self.layout.filename_key)
        filename_key = self.layout.filename_key if names_files and names_files.kind == onu_tfrecord.BYTES else ''
        return RecordSet(layout=self.layout, folder=self.folder, split=split, data_format=data_format,
                         files=files, records_per_file=tuple(counts), compression=first.compression,
                         image_key=first.image_key, filename_key=filename_key, labels=labels,
                         record_bytes=sum(os.path.getsize(path) for path in files))

    def source_paths(self):
        """Paths of what converting these records reads, sorted: the record files, their names and counts files."""
        beside = [os.path.join(self.folder, name) for name in self.layout.names_files
                  + ((self.layout.counts_file.name,) if self.layout.counts_file else ())]
        return sorted([path for group in self.groups for path in group.files]
                      + [path for path in beside if os.path.isfile(path)])


@dataclasses.dataclass(frozen=True)
class RecordSet:
    """One split of other tools' records in one data format, ready to read: files, counts, keys, labels."""
    layout: RecordLayout    # its label, size and text keys
    folder: str
    split: str
    data_format: str
    files: tuple
    records_per_file: tuple
    compression: str        # 'NONE', 'GZIP', 'ZLIB'
    image_key: str
    filename_key: str       # '' if the records name no file
    labels: Labels
    record_bytes: int

    @property
    def num_examples(self):
        """The records of the split."""
        return sum(self.records_per_file)
