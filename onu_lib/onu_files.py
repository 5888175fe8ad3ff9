"""This repo's own files: written whole or not at all, and the cache folder outside the data folders.

Pure Python, importing nothing of this repo: the data modules and their worker processes use it.
"""
import hashlib
import os

CACHE_DIR_ENV = 'ONU_CACHE_DIR'


def write_text_atomic(path, text):
    """Writes text to path through a temporary file and a rename, so readers never see half a file."""
    write_bytes_atomic(path, text.encode('utf-8'))


def write_bytes_atomic(path, data):
    """Writes data to path through a temporary file and a rename; a failed write leaves no temporary file."""
    temp_path = f'{path}.tmp-{os.getpid()}'
    try:
        with open(temp_path, 'wb') as f:
            f.write(data)
        os.replace(temp_path, path)
    except BaseException:
        if os.path.exists(temp_path):
            os.remove(temp_path)
        raise


def cache_dir():
    """Where what is derived from data folders is kept outside them: $ONU_CACHE_DIR, else the user's cache folder."""
    if os.environ.get(CACHE_DIR_ENV):
        return os.environ[CACHE_DIR_ENV]
    return os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'onu-classifier')


def folder_key(folder):
    """A file name for folder in the cache: its base name and a hash of its real path."""
    real = os.path.realpath(folder)
    return f'{os.path.basename(real) or "root"}-{hashlib.sha256(os.fsencode(real)).hexdigest()[:12]}'
