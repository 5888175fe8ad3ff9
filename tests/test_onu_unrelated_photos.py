"""Tests of onu_lib/onu_unrelated_photos.py: the photos that are not ONUs, of every entry of KINDS (iterated, so a new
kind is tested at once): their size, type and seeding, what flat and noise photos look like, and the JPEG folders
write_unrelated_photos() writes (decoded with Pillow, an independent reader)."""
import os

import numpy as np
import pytest
from PIL import Image

from onu_lib import onu_unrelated_photos

WIDTH, HEIGHT = onu_unrelated_photos.PHOTO_SIZE


def _channel_spread(image):
    """The standard deviation of each colour channel over the photo's pixels."""
    return image.reshape(-1, 3).astype(np.float64).std(axis=0)


@pytest.mark.parametrize('kind', onu_unrelated_photos.KIND_NAMES)
def test_every_kind_gives_rgb_photos_of_the_photo_size_the_same_for_the_same_arguments(kind):
    photo = onu_unrelated_photos.unrelated_photo(kind, 0)
    assert (WIDTH, HEIGHT) == (400, 300)
    assert photo.dtype == np.uint8 and photo.shape == (300, 400, 3)
    np.testing.assert_array_equal(onu_unrelated_photos.unrelated_photo(kind, 0), photo)
    np.testing.assert_array_equal(onu_unrelated_photos.unrelated_photo(kind, 0, seed=0), photo)
    for other in (onu_unrelated_photos.unrelated_photo(kind, 1), onu_unrelated_photos.unrelated_photo(kind, 0, seed=1)):
        assert other.shape == photo.shape
        assert np.mean(np.abs(other.astype(int) - photo.astype(int))) > 1.0


def test_flat_photos_are_nearly_one_colour_and_noise_photos_are_not():
    flat = [onu_unrelated_photos.unrelated_photo('flat', index) for index in range(20)]
    noise = [onu_unrelated_photos.unrelated_photo('noise', index) for index in range(20)]
    assert max(_channel_spread(photo).max() for photo in flat) < 12  # a camera's sensor noise, no more
    assert min(_channel_spread(photo).min() for photo in noise) > 30
    # The colours themselves are spread over the range.
    colours = np.array([photo.reshape(-1, 3).mean(axis=0) for photo in flat])
    assert np.all(np.ptp(colours, axis=0) > 150), colours


def test_written_photos_are_jpegs_of_each_kind_in_a_folder_of_their_own(tmp_path):
    directory = str(tmp_path / 'unrelated')
    paths = onu_unrelated_photos.write_unrelated_photos(directory, 3, seed=2)
    kinds = onu_unrelated_photos.KIND_NAMES
    assert sorted(paths) == sorted(kinds) and sorted(os.listdir(directory)) == sorted(kinds)
    for kind in kinds:
        assert paths[kind] == [os.path.join(directory, kind, f'{index:05d}.jpg') for index in range(3)]
        assert sorted(os.listdir(os.path.join(directory, kind))) == ['00000.jpg', '00001.jpg', '00002.jpg']
        for index, path in enumerate(paths[kind]):
            with Image.open(path) as image:
                assert image.format == 'JPEG' and image.mode == 'RGB' and image.size == (WIDTH, HEIGHT)
                decoded = np.asarray(image)
            # The photo of (kind, index, seed), in RGB order: each channel's mean as made.
            made = onu_unrelated_photos.unrelated_photo(kind, index, seed=2)
            np.testing.assert_allclose(decoded.reshape(-1, 3).mean(axis=0), made.reshape(-1, 3).mean(axis=0),
                                       atol=3, err_msg=path)


def test_a_flat_photo_is_written_in_its_own_colour_not_bgr(tmp_path):
    paths = onu_unrelated_photos.write_unrelated_photos(str(tmp_path), 5, kinds=('flat',))
    reds_and_blues = []
    for index, path in enumerate(paths['flat']):
        made = onu_unrelated_photos.unrelated_photo('flat', index).reshape(-1, 3).mean(axis=0)
        with Image.open(path) as image:
            written = np.asarray(image).reshape(-1, 3).mean(axis=0)
        np.testing.assert_allclose(written, made, atol=3, err_msg=path)
        reds_and_blues.append(abs(made[0] - made[2]))
    assert max(reds_and_blues) > 30  # a photo whose red and blue differ: BGR would not pass for RGB


def test_kinds_limits_what_is_written(tmp_path):
    paths = onu_unrelated_photos.write_unrelated_photos(str(tmp_path), 2, kinds=('noise', 'flat'))
    assert list(paths) == ['noise', 'flat']
    assert sorted(os.listdir(tmp_path)) == ['flat', 'noise']
    assert all(len(os.listdir(tmp_path / kind)) == 2 for kind in ('flat', 'noise'))
    assert onu_unrelated_photos.write_unrelated_photos(str(tmp_path / 'none'), 0, kinds=('face',)) == {'face': []}
