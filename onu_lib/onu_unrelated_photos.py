"""Photos that are not ONUs, made here with no download: what a model's "known" score is measured against.

Each entry of KINDS makes one kind of photo from a numpy Generator; the natural ones start from the photos and
scans that ship with matplotlib (its sample data: a portrait, a wrapped present, a brain scan, terrain relief):
  natural: a whole sample picture, mildly re-framed, flipped and re-exposed;
  crop:    a random crop (a tenth to half of it) of one, any aspect;
  face:    the portrait's face, framed loosely or tightly, in colour or grey;
  flat:    one colour with a camera's sensor noise (a wall, a sheet of paper, a lens cap);
  noise:   pixel noise, fine or blurred into blobs, grey or colour;
  scene:   an empty table or wall of the sample data (its backgrounds and camera, no device);
  lookalike: a device of neither sample class on such a table (onu_sample_data.LOOKALIKE_LAYOUTS), the hard case.
ISSUE_KINDS are the kinds every model should call unknown; scene and lookalike share the sample data's own scenes.
write_unrelated_photos() writes them as DIR/<kind>/NNNNN.jpg, the layout of a split, so onu_predict.py reads them.
"""
import dataclasses
import functools
import gzip
import os

import cv2
import numpy as np

from onu_lib import onu_sample_data

PHOTO_SIZE = (400, 300)  # (width, height), JPEGs of a downsized photo
JPEG_QUALITY = 90


@functools.lru_cache(maxsize=None)
def _sample_pictures():
    """matplotlib's sample pictures as uint8 RGB arrays: portrait, present, brain scan, terrain relief."""
    from matplotlib import cbook
    from matplotlib import colormaps
    from matplotlib import colors

    def path(name):
        return cbook.get_sample_data(name, asfileobj=False)

    portrait = cv2.cvtColor(cv2.imread(str(path('grace_hopper.jpg'))), cv2.COLOR_BGR2RGB)
    present = cv2.cvtColor(cv2.imread(str(path('Minduka_Present_Blue_Pack.png'))), cv2.COLOR_BGR2RGB)
    with gzip.open(path('s1045.ima.gz')) as f:
        scan = np.frombuffer(f.read(), np.uint16).reshape(256, 256).astype(np.float32)
    scan = cv2.cvtColor(np.clip(scan / scan.max() * 255, 0, 255).astype(np.uint8), cv2.COLOR_GRAY2RGB)
    elevation = np.load(path('jacksboro_fault_dem.npz'))['elevation']
    relief = colors.LightSource(azdeg=315, altdeg=45).shade(elevation, cmap=colormaps['gist_earth'], blend_mode='soft')
    relief = (relief[..., :3] * 255).astype(np.uint8)
    return {'portrait': portrait, 'present': present, 'scan': scan, 'relief': relief}


def _fit(image, size=PHOTO_SIZE):
    """image resized to fill size (width, height), cropped to its aspect at the centre."""
    width, height = size
    scale = max(width / image.shape[1], height / image.shape[0])
    resized = cv2.resize(image, (max(width, round(image.shape[1] * scale)), max(height, round(image.shape[0] * scale))),
                         interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    top, left = (resized.shape[0] - height) // 2, (resized.shape[1] - width) // 2
    return resized[top:top + height, left:left + width]


def _crop(image, rng, min_area, max_area, centre=None):
    """A random crop of image covering min_area..max_area of it (around centre (x, y) in [0, 1] if given)."""
    height, width = image.shape[:2]
    area = rng.uniform(min_area, max_area) * height * width
    aspect = np.exp(rng.uniform(np.log(0.6), np.log(1.6)))
    crop_w = int(min(width, max(8, np.sqrt(area * aspect))))
    crop_h = int(min(height, max(8, np.sqrt(area / aspect))))
    if centre is None:
        left, top = rng.integers(0, width - crop_w + 1), rng.integers(0, height - crop_h + 1)
    else:
        left = int(np.clip(centre[0] * width - crop_w / 2 + rng.normal(0, 0.05) * crop_w, 0, width - crop_w))
        top = int(np.clip(centre[1] * height - crop_h / 2 + rng.normal(0, 0.05) * crop_h, 0, height - crop_h))
    return image[top:top + crop_h, left:left + crop_w]


def _exposed(image, rng):
    """image with a random exposure and colour cast, maybe mirrored."""
    image = image.astype(np.float32) * rng.uniform(0.7, 1.2) * np.exp(rng.normal(0, 0.06, 3)).astype(np.float32)
    image = np.clip(image, 0, 255).astype(np.uint8)
    return image[:, ::-1] if rng.random() < 0.5 else image


def _natural(rng):
    """A whole sample picture, mildly re-framed."""
    pictures = _sample_pictures()
    picture = pictures[sorted(pictures)[rng.integers(len(pictures))]]
    return _fit(_exposed(_crop(picture, rng, 0.8, 1.0), rng))


def _crop_kind(rng):
    """A random crop of a sample picture."""
    pictures = _sample_pictures()
    picture = pictures[sorted(pictures)[rng.integers(len(pictures))]]
    return _fit(_exposed(_crop(picture, rng, 0.1, 0.5), rng))


FACE_CENTRE = (0.5, 0.33)  # the portrait's face, as a share of its width and height


def _face(rng):
    """The portrait's face, loosely or tightly framed, in colour or grey."""
    face = _exposed(_crop(_sample_pictures()['portrait'], rng, 0.12, 0.45, FACE_CENTRE), rng)
    if rng.random() < 0.3:
        face = cv2.cvtColor(cv2.cvtColor(face, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)
    return _fit(face)


def _sensor_noise(image, rng):
    """image (float32) with a camera's sensor noise, as uint8."""
    noisy = image + rng.normal(0, rng.uniform(2, 10), image.shape).astype(np.float32)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def _flat(rng):
    """One colour with sensor noise."""
    width, height = PHOTO_SIZE
    return _sensor_noise(np.full((height, width, 3), rng.uniform(0, 255, 3), np.float32), rng)


def _noise(rng):
    """Pixel noise, fine or blurred into blobs, grey or colour."""
    width, height = PHOTO_SIZE
    channels = 3 if rng.random() < 0.7 else 1
    noise = rng.uniform(0, 255, (height, width, channels)).astype(np.float32)
    if rng.random() < 0.5:
        noise = cv2.GaussianBlur(noise, (0, 0), rng.uniform(2, 20)).reshape(height, width, channels)
        noise = (noise - noise.mean()) / (noise.std() + 1e-6) * 60 + 128
    return np.clip(np.broadcast_to(noise, (height, width, 3)), 0, 255).astype(np.uint8)


def _scene(rng):
    """A table or wall of the sample data with nothing on it, through its camera."""
    width, height = PHOTO_SIZE
    return onu_sample_data.empty_scene(rng, width, height)


def _lookalike(rng):
    """A device of neither sample class, photographed as the sample data's are."""
    width, height = PHOTO_SIZE
    name = sorted(onu_sample_data.LOOKALIKE_LAYOUTS)[rng.integers(len(onu_sample_data.LOOKALIKE_LAYOUTS))]
    return onu_sample_data.render_photo(name, rng, width, height)


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of photo that is not an ONU."""
    name: str
    make: object  # make(rng) -> uint8 RGB [height, width, 3]
    description: str


KINDS = (
    Kind('natural', _natural, "a whole picture of matplotlib's sample data"),
    Kind('crop', _crop_kind, 'a random crop of one'),
    Kind('face', _face, "the sample portrait's face"),
    Kind('flat', _flat, 'one colour with sensor noise'),
    Kind('noise', _noise, 'pixel noise, fine or blurred'),
    Kind('scene', _scene, 'an empty table or wall of the sample data'),
    Kind('lookalike', _lookalike, 'a device of neither sample class on such a table'),
)
KIND_NAMES = tuple(kind.name for kind in KINDS)
ISSUE_KINDS = ('natural', 'crop', 'face', 'flat', 'noise')  # not ONUs, nor anything like the sample photos


def unrelated_photo(kind_name, index, seed=0):
    """Photo number index of kind_name: uint8 RGB [height, width, 3], the same for the same arguments."""
    kind = KINDS[KIND_NAMES.index(kind_name)]
    return kind.make(np.random.default_rng([seed, KIND_NAMES.index(kind_name), index]))


def write_unrelated_photos(directory, per_kind, seed=0, kinds=KIND_NAMES):
    """Writes per_kind JPEGs of each of kinds as directory/<kind>/NNNNN.jpg; returns {kind: [paths]}."""
    paths = {}
    for kind_name in kinds:
        os.makedirs(os.path.join(directory, kind_name), exist_ok=True)
        paths[kind_name] = []
        for index in range(per_kind):
            path = os.path.join(directory, kind_name, f'{index:05d}.jpg')
            image = unrelated_photo(kind_name, index, seed)
            ok, encoded = cv2.imencode('.jpg', np.ascontiguousarray(image[..., ::-1]),
                                       [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
            if not ok:
                raise RuntimeError(f'OpenCV could not encode {path}')
            with open(path, 'wb') as f:
                f.write(encoded.tobytes())
            paths[kind_name].append(path)
    return paths
