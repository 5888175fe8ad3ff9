"""One photo file: its format sniffed from the content, its EXIF orientation, its upright RGB pixels.

    header = read_image_header(path)          # format, mode, stored size, orientation (no full decode for JPEGs)
    info = read_image_info(path, label, name)  # an ImageInfo: usable or UnreadableImage(reason)
    image = upright_rgb(path, orientation)     # the pixels every feeding mode sees

Every tool reads photos through these, so that the three feeding modes see the same pixels. Pure Python +
Pillow, no TensorFlow: the data scripts and their worker processes import it cheaply.
"""
import dataclasses
import io
import os
import re
import warnings

from PIL import Image

JPEG_FORMATS = ('JPEG', 'MPO')  # Pillow calls multi-picture camera JPEGs 'MPO'; they decode as JPEG.
# Files kept byte for byte in encoded records: TensorFlow decodes them to the same RGB pixels as Pillow's
# convert('RGB') (alpha dropped, grey and palette expanded). CMYK JPEGs and 16-bit PNGs are not among them.
KEPT_MODES = {'JPEG': ('RGB', 'L'), 'MPO': ('RGB', 'L'), 'PNG': ('RGB', 'L', 'RGBA', 'LA', 'P')}
# What tf.io.decode_image reads (of BMPs, not 1-bit ones: tensorflow_decodes).
TF_DECODABLE_FORMATS = JPEG_FORMATS + ('PNG', 'GIF', 'BMP', 'WEBP')
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
# The most pixels (width x height) an image sent to be classified may have: the serving
# graph refuses more before decoding (onu_export.py --max_image_pixels, recorded in the export), and onu_predict.py
# refuses more before Pillow decodes. The photos ONU technicians take are phone photos of up to about 50 MP
# (8160x6144 = 50.1 M): 60 M keeps a 20% margin over them. A 60 MP image decodes to 180 MB of RGB, while a 1 MB
# PNG of one colour can declare 529 M pixels. 64, 108 and 200 MP phone modes are refused too: their cameras save
# binned 12-50 MP photos unless told otherwise.
MAX_IMAGE_PIXELS = 60_000_000
_JPEG_END_MARKER = b'\xff\xd9'
_TAIL_BYTES = 64


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


def tensorflow_decodes(image):
    """True if TensorFlow's decoders read an image of this format and mode (an ImageInfo's or ImageHeader's)."""
    return image.image_format in TF_DECODABLE_FORMATS and (image.image_format, image.mode) != ('BMP', '1')


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


@dataclasses.dataclass(frozen=True)
class ImageHeader:
    """What an image's header says: format sniffed from the content, Pillow mode, stored size, EXIF orientation."""
    image_format: str  # 'JPEG', 'PNG', 'BMP', 'GIF', ...
    mode: str
    width: int  # as stored, before the EXIF orientation
    height: int
    orientation: int  # EXIF 1..8, 1 = none


def _damaged(image_format, error):
    """The UnreadableImage of a file Pillow found damaged while reading it."""
    what = f'damaged {image_format} file' if image_format else 'damaged or unsupported file'
    message = ' '.join(str(error).split()) or type(error).__name__
    return UnreadableImage(f'{what}: {message}')


def over_the_limit(max_pixels):
    """The end of every refusal of an image with too many pixels: the limit and how it is set."""
    return f'over the limit of {max_pixels} (onu_export.py --max_image_pixels)'


def too_many_pixels(width, height, max_pixels):
    """The reason an image of width x height pixels is refused under a limit of max_pixels."""
    return f'too many pixels: {width} x {height} = {width * height} pixels, {over_the_limit(max_pixels)}'


def _pillow_refused(error, max_pixels):
    """The UnreadableImage of an image Pillow's own decompression-bomb check refused as it opened it."""
    found = re.search(r'\((\d+) pixels\)', str(error))
    pixels = f'{found.group(1)} pixels' if found else 'more pixels than Pillow opens'
    return UnreadableImage(f'too many pixels: {pixels} (size not read: Pillow refuses to open it), '
                           f'{over_the_limit(max_pixels)}')


def read_image_header(source, max_pixels=None):
    """The ImageHeader of an image file (a path) or of image bytes; UnreadableImage(reason) if it cannot be used.
    Only a JPEG with its end-of-image marker is not fully decoded (a cheap check that it is whole). max_pixels: an
    image of more pixels (width x height, from the header) is refused before anything is decoded."""
    image_format = None
    try:
        with warnings.catch_warnings():
            if max_pixels is not None:  # the limit below decides, not Pillow's own warning
                warnings.simplefilter('ignore', Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        with image:
            image_format, mode, (width, height) = image.format, image.mode, image.size
            if max_pixels is not None and width * height > max_pixels:
                raise UnreadableImage(too_many_pixels(width, height, max_pixels))
            if image_format not in JPEG_FORMATS or not _has_jpeg_end_marker(image.fp):
                image.load()
            orientation = _orientation(image)
    except Image.UnidentifiedImageError:
        raise UnreadableImage('not an image Pillow can read (content is not JPEG, PNG, BMP, GIF, ...)') from None
    except UnreadableImage:
        raise
    except Image.DecompressionBombError as error:
        if max_pixels is None:
            raise _damaged(image_format, error) from None
        raise _pillow_refused(error, max_pixels) from None
    except Exception as error:  # Pillow reports damaged files with OSError, SyntaxError, ValueError, ...
        raise _damaged(image_format, error) from None
    return ImageHeader(image_format, mode, width, height, orientation)


def read_image_info(path, label=0, class_name='', max_pixels=None):
    """The ImageInfo of one file (read_image_header's checks), or UnreadableImage(reason) if it cannot be used."""
    num_bytes = os.path.getsize(path)
    if num_bytes == 0:
        raise UnreadableImage('empty file')
    header = read_image_header(path, max_pixels)
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
        return to_rgb(image)


def to_rgb(image):
    """The PIL image's pixels (read now) as RGB, as every feeding mode sees them (alpha dropped)."""
    image.load()
    return image if image.mode == 'RGB' else image.convert('RGB')


def why_undecodable(path):
    """Why a photo whose header passed cannot be decoded, in a few words (from Pillow's full decode of it)."""
    if not os.path.isfile(path):
        return 'unreadable (the file is gone)'
    image_format = None
    try:
        with Image.open(path) as image:
            image_format = image.format
            image.load()
    except Exception as error:  # Pillow reports damaged files with OSError, SyntaxError, ValueError, ...
        return f'cannot be decoded ({_damaged(image_format, error)})'
    return 'cannot be decoded by TensorFlow, though Pillow reads it (re-save it as PNG or JPEG)'
