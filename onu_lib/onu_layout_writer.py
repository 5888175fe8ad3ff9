"""Photos written as another tool writes its records, from the tool's onu_layouts entry (file names, keys, labels,
names file and counts file): the tests' records of every layout, and the benchmark's Inception shards.

    write_records(onu_layouts.layout_named('slim'), folder, [StoredImage(...), ...], class_names)
"""
import dataclasses
import os

from onu_lib import onu_files
from onu_lib import onu_layouts
from onu_lib import onu_tfrecord


@dataclasses.dataclass(frozen=True)
class StoredImage:
    """One image to store as a tool would: its split, class (0-based), bytes, upright size and file name."""
    split: str
    label: int
    data: bytes  # the file's bytes (encoded records), or PIL's tobytes of the image as opened (raw records)
    width: int
    height: int
    file_name: str


def _stored_record(layout, image, class_names, data_format, keys):
    """The serialized record of one image as the layout's tool writes it (keys: the written_keys written)."""
    image_key = next(key for key, key_format in layout.image_keys.items() if key_format == data_format)
    features = {image_key: image.data, layout.label_key: image.label + (layout.labels_base or 0)}
    written = {onu_layouts.SLIM_HEIGHT: image.height, onu_layouts.SLIM_WIDTH: image.width, 'image/channels': 3,
               onu_layouts.SLIM_FORMAT: 'jpeg', onu_layouts.SLIM_TEXT: class_names[image.label],
               onu_layouts.SLIM_FILENAME: image.file_name, 'image/colorspace': 'RGB'}
    features.update({key: written[key] for key in keys})
    if data_format == 'raw':
        features.update({layout.height_key: image.height, layout.width_key: image.width})
    return onu_tfrecord.serialize_example(features)


def _names_file_text(layout, class_names):
    """The layout's names file of class_names (the first class's label is labels_base), as its tool writes it."""
    first = layout.labels_base or 0
    if layout.names_form == 'ids':
        return ''.join(f'{first + index}:{name}\n' for index, name in enumerate(class_names))
    return ''.join(f'{name}\n' for name in class_names)


def write_records(layout, folder, images, class_names, data_format='encoded', num_shards=2, compression='NONE',
                  names_file=None, keys=None, name='flowers'):
    """Writes StoredImages as layout's tool does; returns the folder to give as --data_dir. num_shards: per split, or
    {split: shards}; keys: the written_keys to write (None: all); names_file None: if the tool writes one."""
    data_dir = os.path.join(folder, name) if layout.version_folder else folder
    target = os.path.join(data_dir, layout.version_folder) if layout.version_folder else folder
    os.makedirs(target, exist_ok=True)
    keys = layout.written_keys if keys is None else keys
    lengths = {}
    for split, token in layout.split_tokens.items():
        count = (num_shards[split] if isinstance(num_shards, dict) else num_shards) if layout.sharded else 1
        chosen = [image for image in images if image.split == split]
        per_shard = -(-len(chosen) // count)  # trailing shards may be empty, as TF-slim's
        for index in range(count):
            shard = chosen[index * per_shard:(index + 1) * per_shard]
            file_name = layout.file_name_of(token, index, count, data_format, name)
            onu_tfrecord.write_records(os.path.join(target, file_name),
                                       [_stored_record(layout, image, class_names, data_format, keys)
                                        for image in shard], compression)
            lengths.setdefault(token, []).append(len(shard))
    if (layout.writes_names_file if names_file is None else names_file) and layout.names_files:
        onu_files.write_text_atomic(os.path.join(target, layout.names_files[0]), _names_file_text(layout, class_names))
    if layout.counts_file:
        layout.counts_file.write(os.path.join(target, layout.counts_file.name), lengths)
    return data_dir
