"""The sample dataset: ONU-like photos generated here, so everything runs on a fresh machine with no download.

Two device classes are drawn by one renderer from the same palette, lighting, background and camera
distributions; only the device details differ:
  F603:  two tall antennas, four ports in a row, one row of six LEDs, label at the bottom left;
  F663N: no antennas, two wide ports (the same dark area as four), LEDs in a 2x3 block, label at the top left.
So global colour and brightness statistics carry no class information: a model has to learn shapes.
Every photo is seeded from (seed, split, class, index): the output does not depend on the process count.

The library behind make_sample_data.py (and onu_train.py's built-in data): generate_dataset().
"""

import json
import math
import os
import shutil
import statistics
import time

import cv2
import numpy as np

from onu_lib import onu_dataset
from onu_lib import onu_errors
from onu_lib import onu_files
from onu_lib import onu_pool

SAMPLE_CLASS_NAMES = ('F603', 'F663N')
DEFAULT_TRAIN_PER_CLASS = 300
DEFAULT_VAL_PER_CLASS = 100
DEFAULT_PHOTO_SIZE = (800, 600)  # (width, height), like a downsized phone photo
SAMPLE_INFO_FILENAME = 'sample_data.json'
_TEMP_SUBDIR = '.sample-data-tmp'

JPEG_QUALITY_RANGE = (80, 95)
BODY_WIDTH_RANGE = (0.35, 0.55)  # device body width, as a fraction of the largest 4:3 frame inside the photo
FRAME_MARGIN = 0.08  # the device stays this fraction of the frame away from the edges
MAX_TILT_DEGREES = 12
NOISE_SIGMA_RANGE = (8.0, 14.0)  # sensor noise, in 8-bit levels

BACKGROUND_COLOURS = np.array([
    (150, 105, 70), (185, 145, 100), (95, 70, 50), (200, 195, 185), (120, 120, 125), (60, 60, 65),
    (165, 175, 190), (70, 95, 80), (225, 220, 210), (140, 130, 160), (40, 45, 55), (210, 180, 150),
], dtype=np.float32)
BODY_COLOURS = np.array([
    (236, 236, 232), (214, 216, 220), (190, 196, 204), (140, 142, 148), (72, 74, 80), (34, 35, 38),
], dtype=np.float32)
LED_COLOURS = np.array([(70, 230, 100), (255, 170, 40), (90, 160, 255), (95, 95, 95)], dtype=np.float32)
PORT_COLLAR_COLOURS = np.array([(225, 195, 50), (160, 160, 165), (45, 45, 50)], dtype=np.float32)
LABEL_COLOURS = np.array([(245, 245, 240), (205, 208, 212)], dtype=np.float32)

# Device layout in body units (x: fraction of body width, y: fraction of front-face height).
# Equal dark port area for both classes: the recess of a port is its width less 2 x 0.012 of insets,
# and 4 x (0.105 - 0.024) = 2 x (0.186 - 0.024).
LAYOUTS = {
    'F603': {'antennas': True, 'ports': (4, 0.105, 0.03), 'leds': ((0.08, 0.28, 6, 1),), 'label_y': 0.50},
    'F663N': {'antennas': False, 'ports': (2, 0.186, 0.06), 'leds': ((0.60, 0.12, 3, 2),), 'label_y': 0.10},
}
# A device of neither class, drawn by the same renderer: F603's antennas and LEDs with F663N's ports and label. Not in
# the sample data: onu_unrelated_photos renders it, the hard case of a known score (a new model like known ones).
LOOKALIKE_LAYOUTS = {
    'F680': {'antennas': True, 'ports': (2, 0.186, 0.06), 'leds': ((0.08, 0.28, 6, 1),), 'label_y': 0.10},
}
PORT_ROW_RIGHT, PORT_ROW_Y, PORT_HEIGHT = 0.93, 0.50, 0.36
LED_SPACING, LED_RADIUS = 0.055, 0.022
LABEL_X, LABEL_WIDTH, LABEL_HEIGHT = 0.06, 0.24, 0.34
ANTENNA_HEIGHT_RANGE = (0.45, 0.65)  # in body widths
ANTENNA_WIDTH_RANGE = (0.075, 0.1)
BODY_ASPECT_RANGE = (0.26, 0.34)  # front-face height / body width
TOP_DEPTH = 0.07  # the visible top face, in body widths
# Canvas (body widths): the device box both classes are placed by, antenna room included.
CANVAS_WIDTH, CANVAS_HEIGHT, BODY_LEFT, BODY_BOTTOM = 1.3, 1.25, 0.12, 1.15
DEVICE_BOX = (0.1, 0.1, 1.22, 1.17)  # x0, y0, x1, y1

# Standard normal quantiles of 256 equally likely bytes: Gaussian noise from random bytes, much faster.
_GAUSSIAN_FROM_BYTE = np.array([statistics.NormalDist().inv_cdf((k + 0.5) / 256) for k in range(256)], np.float32)


def _colour(palette, rng, jitter=12.0):
    """A palette colour with a small random shift."""
    return np.clip(palette[rng.integers(len(palette))] + rng.normal(0, jitter, 3), 0, 255).astype(np.float32)


def _smooth_noise(rng, height, width, cells):
    """Low-frequency noise in [0, 1] of the given size, about `cells` blobs across."""
    grid = rng.random((max(2, cells * height // width), max(2, cells)), dtype=np.float32)
    return cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC).clip(0, 1)


def _background(rng, height, width):
    """A textured surface: wood, fabric, a wall gradient or tiles, float32 RGB."""
    base, other = _colour(BACKGROUND_COLOURS, rng), _colour(BACKGROUND_COLOURS, rng)
    kind = rng.integers(4)
    low_h, low_w = max(2, height // 2), max(2, width // 2)  # drawn at half size: textures are soft anyway
    yy, xx = np.indices((low_h, low_w), dtype=np.float32) / max(low_h, low_w)
    if kind == 0:  # wood grain
        angle = rng.uniform(0, math.pi)
        warp = 3.0 * _smooth_noise(rng, low_h, low_w, 4)
        along = xx * math.cos(angle) + yy * math.sin(angle)
        mix = 0.5 + 0.5 * np.sin(2 * math.pi * rng.uniform(8, 25) * along + warp)
        other = base * rng.uniform(0.6, 0.85)
    elif kind == 1:  # fabric / carpet
        mix = rng.random((low_h, low_w), dtype=np.float32) * 0.8 + 0.2 * _smooth_noise(rng, low_h, low_w, 6)
    elif kind == 2:  # wall with a gradient and blotches
        angle = rng.uniform(0, 2 * math.pi)
        mix = 0.5 + 0.5 * (xx * math.cos(angle) + yy * math.sin(angle))
        mix = 0.7 * mix + 0.3 * _smooth_noise(rng, low_h, low_w, 5)
    else:  # tiles
        cell = max(3, int(rng.uniform(0.08, 0.2) * low_w))
        line = max(1, cell // 14)
        mix = 0.25 * _smooth_noise(rng, low_h, low_w, 3)
        mix[(np.arange(low_h) % cell) < line, :] = 1.0
        mix[:, (np.arange(low_w) % cell) < line] = 1.0
    mix = mix.clip(0, 1)[..., None]
    return cv2.resize(base * (1 - mix) + other * mix, (width, height), interpolation=cv2.INTER_LINEAR)


def _draw_cable(rng, image):
    """Draws a cable lying on the table (a distractor shared by both classes)."""
    height, width = image.shape[:2]
    points = np.stack([rng.uniform(0, width, 4), rng.uniform(0, height, 4)], axis=1)
    t = np.linspace(0, 1, 40)[:, None]
    curve = ((1 - t) ** 3 * points[0] + 3 * (1 - t) ** 2 * t * points[1]
             + 3 * (1 - t) * t ** 2 * points[2] + t ** 3 * points[3])
    thickness = max(1, int(width * rng.uniform(0.006, 0.014)))
    colour = tuple(float(c) for c in _colour(BODY_COLOURS, rng))
    cv2.polylines(image, [curve.astype(np.int32)], False, colour, thickness, cv2.LINE_AA)


def _rounded_rect(x0, y0, x1, y1, radius):
    """Polygon points of a rectangle with rounded corners."""
    radius = max(0, min(radius, (x1 - x0) / 2, (y1 - y0) / 2))
    corners = ((x1 - radius, y0 + radius, 270), (x1 - radius, y1 - radius, 0),
               (x0 + radius, y1 - radius, 90), (x0 + radius, y0 + radius, 180))
    points = []
    for cx, cy, start in corners:
        for a in np.radians(np.linspace(start, start + 90, 6)):
            points.append((cx + radius * math.cos(a), cy + radius * math.sin(a)))
    return np.array(points)


def _fill(canvas, points, colour, shift=4):
    """Fills a float polygon on the canvas with anti-aliased edges (sub-pixel precise)."""
    scaled = np.round(np.asarray(points) * (1 << shift)).astype(np.int32)
    cv2.fillPoly(canvas, [scaled], tuple(float(c) for c in colour), cv2.LINE_AA, shift)


def _draw_antenna(canvas, alpha, rng, base_x, base_y, unit, colour):
    """Draws one flat antenna standing on the device's back edge, slightly tilted."""
    height = unit * rng.uniform(*ANTENNA_HEIGHT_RANGE)
    half = unit * rng.uniform(*ANTENNA_WIDTH_RANGE) / 2
    tilt = math.radians(rng.uniform(-15, 15))
    shape = _rounded_rect(-half, -height, half, 0, half * 0.8)
    rotation = np.array([[math.cos(tilt), -math.sin(tilt)], [math.sin(tilt), math.cos(tilt)]])
    points = shape @ rotation.T + (base_x, base_y)
    _fill(canvas, points, colour)
    _fill(alpha, points, (255,))


def _draw_front_details(canvas, layout, rng, left, top, unit, face_height):
    """Draws the ports, LEDs, label and logo of one device class on the front face."""
    def box(fx0, fy0, fx1, fy1):
        return left + fx0 * unit, top + fy0 * face_height, left + fx1 * unit, top + fy1 * face_height

    count, port_width, gap = layout['ports']
    collar = _colour(PORT_COLLAR_COLOURS, rng, 8)
    x = PORT_ROW_RIGHT - count * port_width - (count - 1) * gap
    for _ in range(count):
        x0, y0, x1, y1 = box(x, PORT_ROW_Y, x + port_width, PORT_ROW_Y + PORT_HEIGHT)
        _fill(canvas, _rounded_rect(x0, y0, x1, y1, unit * 0.01), collar)
        inset = unit * 0.012
        _fill(canvas, _rounded_rect(x0 + inset, y0 + inset, x1 - inset, y1 - inset, 0), (26, 26, 28))
        _fill(canvas, _rounded_rect(x0 + 2 * inset, y0 + 2 * inset, x1 - 2 * inset, y0 + 4 * inset, 0),
              (150, 135, 90))
        x += port_width + gap
    for fx, fy, columns, rows in layout['leds']:
        for row in range(rows):
            for column in range(columns):
                cx = left + (fx + column * LED_SPACING) * unit
                cy = top + fy * face_height + row * LED_SPACING * unit * 1.2
                r = LED_RADIUS * unit
                _fill(canvas, _rounded_rect(cx - r, cy - r, cx + r, cy + r, r), _colour(LED_COLOURS, rng, 10))
    x0, y0, x1, y1 = box(LABEL_X, layout['label_y'], LABEL_X + LABEL_WIDTH, layout['label_y'] + LABEL_HEIGHT)
    _fill(canvas, _rounded_rect(x0, y0, x1, y1, unit * 0.008), _colour(LABEL_COLOURS, rng, 5))
    for line in range(3):
        ly = y0 + (y1 - y0) * (0.2 + 0.25 * line)
        lx1 = x0 + (x1 - x0) * rng.uniform(0.5, 0.9)
        _fill(canvas, _rounded_rect(x0 + (x1 - x0) * 0.1, ly, lx1, ly + (y1 - y0) * 0.1, 0), (60, 60, 65))
    x0, y0, x1, y1 = box(0.42, 0.12, 0.54, 0.2)
    _fill(canvas, _rounded_rect(x0, y0, x1, y1, unit * 0.01), _colour(LED_COLOURS[:3], rng, 20) * 0.6)


def _device_canvas(class_name, rng, unit):
    """The device drawn front-on, body `unit` pixels wide: float32 RGBA canvas, alpha 0..255."""
    layout = {**LAYOUTS, **LOOKALIKE_LAYOUTS}[class_name]
    canvas_w, canvas_h = int(CANVAS_WIDTH * unit), int(CANVAS_HEIGHT * unit)
    canvas = np.zeros((canvas_h, canvas_w, 3), np.float32)
    alpha = np.zeros((canvas_h, canvas_w), np.float32)
    body = _colour(BODY_COLOURS, rng, 6)
    face_height = unit * rng.uniform(*BODY_ASPECT_RANGE)
    left, right, bottom = BODY_LEFT * unit, (BODY_LEFT + 1) * unit, BODY_BOTTOM * unit
    top = bottom - face_height
    depth = TOP_DEPTH * unit
    if layout['antennas']:
        antenna = np.clip(body * rng.uniform(0.85, 1.0), 0, 255)
        for fx in (0.1, 0.9):
            _draw_antenna(canvas, alpha, rng, left + fx * unit + depth * 0.5, top - depth * 0.8, unit, antenna)
    top_face = np.array([(left, top), (left + depth * 0.6, top - depth), (right + depth * 0.6, top - depth),
                         (right, top)])
    side_face = np.array([(right, top), (right + depth * 0.6, top - depth), (right + depth * 0.6, bottom - depth),
                          (right, bottom)])
    front = _rounded_rect(left, top, right, bottom, unit * 0.02)
    for points, shade in ((top_face, 1.1), (side_face, 0.75), (front, 1.0)):
        _fill(canvas, points, np.clip(body * shade, 0, 255))
        _fill(alpha, points, (255,))
    _fill(canvas, _rounded_rect(left, bottom - face_height * 0.06, right, bottom, 0), body * 0.8)
    _draw_front_details(canvas, layout, rng, left, top, unit, face_height)
    return np.dstack([canvas, alpha])


def _placement(rng, unit, body_px, width, height):
    """A homography from canvas to photo: scale, tilt, perspective and position, device box inside the frame."""
    scale = body_px / unit
    tilt = math.radians(rng.uniform(-MAX_TILT_DEGREES, MAX_TILT_DEGREES))
    canvas_corners = np.array([(0, 0), (CANVAS_WIDTH, 0), (CANVAS_WIDTH, CANVAS_HEIGHT), (0, CANVAS_HEIGHT)]) * unit
    centre = canvas_corners.mean(axis=0)
    rotation = np.array([[math.cos(tilt), -math.sin(tilt)], [math.sin(tilt), math.cos(tilt)]])
    placed = (canvas_corners - centre) @ rotation.T * scale
    placed += rng.uniform(-0.05, 0.05, placed.shape) * body_px  # perspective: corners move independently
    homography = cv2.getPerspectiveTransform(canvas_corners.astype(np.float32), placed.astype(np.float32))
    x0, y0, x1, y1 = np.array(DEVICE_BOX) * unit
    box = np.array([[(x0, y0), (x1, y0), (x1, y1), (x0, y1)]], np.float32)
    box = cv2.perspectiveTransform(box, homography)[0]
    shift = []
    for axis, size in ((0, width), (1, height)):
        low = FRAME_MARGIN * size - box[:, axis].min()
        high = size - FRAME_MARGIN * size - box[:, axis].max()
        shift.append(rng.uniform(low, high) if high > low else (low + high) / 2)
    translate = np.array([[1, 0, shift[0]], [0, 1, shift[1]], [0, 0, 1]])
    return translate @ homography


def _apply_camera(rng, image):
    """Lighting gradient, vignette, exposure, colour cast, blur and sensor noise, like a phone camera."""
    height, width = image.shape[:2]
    yy, xx = np.indices((16, 16), dtype=np.float32) / 15 - 0.5  # lighting is smooth: computed coarse
    angle = rng.uniform(0, 2 * math.pi)
    light = 1 + rng.uniform(0, 0.5) * (xx * math.cos(angle) + yy * math.sin(angle))
    light *= 1 - rng.uniform(0, 0.5) * (xx ** 2 + yy ** 2)
    image *= cv2.resize(light, (width, height), interpolation=cv2.INTER_LINEAR)[..., None]
    image *= rng.uniform(0.6, 1.25) * np.exp(rng.normal(0, 0.07, 3)).astype(np.float32)
    image = cv2.convertScaleAbs(image)  # to uint8, saturating
    sigma = rng.uniform(0.3, 1.6) * width / 800 if rng.random() < 0.6 else 0
    if sigma > 0.2:
        image = cv2.GaussianBlur(image, (0, 0), sigma)
    if rng.random() < 0.15:
        length = max(3, int(rng.uniform(0.004, 0.012) * width)) | 1
        kernel = np.zeros((length, length), np.float32)
        kernel[length // 2, :] = 1 / length
        rotation = cv2.getRotationMatrix2D((length / 2 - 0.5, length / 2 - 0.5), rng.uniform(0, 180), 1)
        image = cv2.filter2D(image, -1, cv2.warpAffine(kernel, rotation, (length, length)))
    noise_table = np.round(_GAUSSIAN_FROM_BYTE * rng.uniform(*NOISE_SIGMA_RANGE)).astype(np.int16)
    noise = cv2.LUT(rng.integers(0, 256, image.shape, dtype=np.uint8), noise_table)
    return cv2.add(image, noise, dtype=cv2.CV_8U)


def _shadow_factor(rng, coverage, body_px):
    """Per-pixel brightness factor of the soft shadow the device casts on the table (computed at 1/4 size)."""
    height, width = coverage.shape
    small_size = (max(1, width // 4), max(1, height // 4))
    small = cv2.resize(coverage, small_size, interpolation=cv2.INTER_AREA)
    offset = np.array([[1, 0, rng.uniform(-0.02, 0.04) * body_px / 4], [0, 1, rng.uniform(0.02, 0.06) * body_px / 4]])
    small = cv2.GaussianBlur(cv2.warpAffine(small, offset, small_size), (0, 0), 0.0075 * body_px + 0.5)
    return 1 - rng.uniform(0.25, 0.5) * cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR)


def render_photo(class_name, rng, width, height):
    """One photo of a device of class_name on a random scene: uint8 RGB array [height, width, 3]."""
    image = _background(rng, height, width)
    if rng.random() < 0.3:
        _draw_cable(rng, image)
    body_px = min(width, height * 4 / 3) * rng.uniform(*BODY_WIDTH_RANGE)
    unit = max(32, int(round(body_px)))
    canvas = _device_canvas(class_name, rng, unit)
    homography = _placement(rng, unit, body_px, width, height)
    device = cv2.warpPerspective(canvas, homography, (width, height), flags=cv2.INTER_LINEAR)
    coverage = device[..., 3] / 255
    image *= _shadow_factor(rng, coverage, body_px)[..., None]
    image = cv2.blendLinear(device[..., :3], image, coverage, 1 - coverage)
    return _apply_camera(rng, image)


def empty_scene(rng, width, height):
    """A photo of a scene of render_photo with no device on it: uint8 RGB array [height, width, 3]."""
    image = _background(rng, height, width)
    if rng.random() < 0.3:
        _draw_cable(rng, image)
    return _apply_camera(rng, image)


def _write_photo(job):
    """Renders one photo and writes it as a JPEG; returns its size in bytes."""
    path, split, class_index, index, (width, height), seed = job
    rng = np.random.default_rng([seed, onu_dataset.SPLITS.index(split), class_index, index])  # the same for any process count
    image = render_photo(SAMPLE_CLASS_NAMES[class_index], rng, width, height)
    quality = int(rng.integers(JPEG_QUALITY_RANGE[0], JPEG_QUALITY_RANGE[1] + 1))
    ok, encoded = cv2.imencode('.jpg', image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError(f'OpenCV could not encode {path}')
    with open(path, 'wb') as f:
        f.write(encoded.tobytes())
    return len(encoded)


def _single_threaded_opencv():
    """Worker initializer: one OpenCV thread per process, since the processes already use every core."""
    cv2.setNumThreads(1)


def generate_dataset(output_dir, train_per_class=DEFAULT_TRAIN_PER_CLASS, val_per_class=DEFAULT_VAL_PER_CLASS,
                     photo_size=DEFAULT_PHOTO_SIZE, seed=0, processes=None):
    """Writes output_dir/{train,val}/{F603,F663N}/NNNNN.jpg of photo_size (width, height); returns the settings and
    totals as a dict. A no-op for the same settings, a DataError for anything else there (never touched); the
    workers are spawned: the caller needs the __main__ guard."""
    width, height = photo_size
    settings = {'class_names': list(SAMPLE_CLASS_NAMES), 'seed': seed, 'image_size': [width, height],
                'per_class': {'train': train_per_class, 'val': val_per_class}}
    info_path = os.path.join(output_dir, SAMPLE_INFO_FILENAME)
    existing_splits = [s for s in onu_dataset.SPLITS if os.path.exists(os.path.join(output_dir, s))]
    if existing_splits:
        try:
            with open(info_path, encoding='utf-8') as f:
                info = json.load(f)
        except (OSError, ValueError):
            info = None
        if info is not None and info.get('settings') == settings:
            return dict(info, generated=False)
        what = 'of sample data made with other settings' if info else 'that is not this sample data'
        raise onu_errors.DataError(f'{output_dir} already holds {"/".join(existing_splits)}/ {what}: '
                                    f'choose an empty --output_dir (nothing was changed)')
    started = time.time()
    temp_dir = os.path.join(output_dir, _TEMP_SUBDIR)
    shutil.rmtree(temp_dir, ignore_errors=True)  # left by an interrupted run of this function
    jobs = []
    splits = [split for split, count in settings['per_class'].items() if count > 0]
    for split in splits:
        count = settings['per_class'][split]
        for class_index, class_name in enumerate(SAMPLE_CLASS_NAMES):
            class_dir = os.path.join(temp_dir, split, class_name)
            os.makedirs(class_dir)
            jobs += [(os.path.join(class_dir, f'{index:05d}.jpg'), split, class_index, index, (width, height), seed)
                     for index in range(count)]
    with onu_pool.process_pool(onu_pool.worker_count(processes), _single_threaded_opencv) as pool:
        sizes = list(onu_pool.parallel_map(_write_photo, jobs, pool, window=64))
    for split in splits:
        os.replace(os.path.join(temp_dir, split), os.path.join(output_dir, split))
    os.rmdir(temp_dir)
    info = {'settings': settings, 'files': len(sizes), 'bytes': sum(sizes),
            'seconds': round(time.time() - started, 2)}
    onu_files.write_text_atomic(info_path, json.dumps(info, indent=1) + '\n')
    return dict(info, generated=True)
