"""Atomic writes: a file or a store directory appears complete at its path, or not at all.

Every writer of the package (model files, checkpoints, Zarr stores) goes through
:func:`atomic_file` or :func:`atomic_directory`: the content is written to a
temporary name in the target's own folder, flushed to disk (``fsync``) and then
renamed over the target, and the folder is ``fsync``-ed where the system
supports it.  A write that fails (a full disk, a file size limit, Ctrl-C)
removes its temporary file and leaves the previous file, if any, untouched; the
error is a :class:`WriteError` naming the file, e.g.
``could not write model file model.npz: [Errno 27] File too large``.
"""

from __future__ import annotations

import contextlib
import errno as errno_module
import hashlib
import os
import re
import shutil
import stat
import threading
import uuid
import warnings

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks (see exclusive_writer)
    fcntl = None

__all__ = [
    "WriteError", "UnsafePathError", "FileBusyError", "atomic_file", "atomic_directory", "exclusive_writer",
    "remove_leftovers", "fsync_directory", "check_output_path", "is_npz_with_meta",
]  # fmt: skip


class WriteError(OSError):
    """A file or store could not be written; whatever was at its path before is unchanged.

    ``str(error)`` is ``"could not write WHAT PATH: [Errno N] reason"``; ``errno``
    and ``strerror`` are those of the underlying error.
    """

    def __init__(self, what: str, path: str, errno=None, strerror: str | None = None):
        super().__init__(errno, strerror)
        self.what, self.path = what, path

    @classmethod
    def wrap(cls, what: str, path: str, exc: BaseException) -> WriteError:
        if isinstance(exc, OSError) and exc.errno is not None:
            return cls(what, path, exc.errno, exc.strerror or str(exc))
        return cls(what, path, None, str(exc) or type(exc).__name__)

    def __str__(self) -> str:
        reason = f"[Errno {self.errno}] {self.strerror}" if self.errno is not None else str(self.strerror)
        return f"could not write {self.what} {self.path}: {reason}"

    def __reduce__(self):
        return type(self), (self.what, self.path, self.errno, self.strerror)


class UnsafePathError(WriteError):
    """An output path the package refuses to write: a link, a device, a FIFO, a file that is not its own, a bad name.

    ``str(error)`` is ``"could not write WHAT PATH: reason"``; nothing was written.
    """

    def __init__(self, what: str, path: str, errno=None, strerror: str | None = None):
        super().__init__(what, path, errno, strerror)

    def __str__(self) -> str:
        return f"could not write {self.what} {self.path}: {self.strerror}"


#: Longest file name (bytes) where the system does not say; Linux, macOS and Windows all allow 255.
_NAME_MAX = 255
#: Longest part of the target's name kept in the names of its temporaries and its lock (room for the suffixes).
_STEM_BYTES = 200
#: Largest lock file taken over: a lock holds a process id; a bigger file at the lock's name is someone's file.
_MAX_LOCK_BYTES = 64
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _stem(name: str) -> str:
    """``name`` as the hidden temporaries and the lock of a file use it: cut (with a digest) to fit NAME_MAX."""
    raw = os.fsencode(name)
    if len(raw) <= _STEM_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return os.fsdecode(raw[:150]) + "~" + digest  # a multi-byte character cut in two stays as its bytes


def _name_max(folder: str) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return _NAME_MAX


def is_npz_with_meta(path: str, member: str) -> bool:
    """Whether ``path`` is a ``.npz`` archive of ``.npy`` members with ``__meta__`` and ``member`` among them.

    What a model file (``classes_``) or a checkpoint (``picks``) of this package looks like; reads the
    archive's directory only (not its members).
    """
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except Exception:  # not a zip archive, unreadable, damaged: not one of ours
        return False
    return {"__meta__.npy", f"{member}.npy"} <= set(names) and all(n.endswith(".npy") for n in names)


def check_output_path(path, what: str = "file", *, is_ours=None, overwrite: bool = False) -> str:
    """``path`` as a place :func:`atomic_file` may write, or an :class:`UnsafePathError` saying why not.

    Refused: an empty name, a name ending in a slash, a name longer than the file system allows,
    a missing folder, a symbolic link (followed, it would replace the file it points to), anything
    that is not a regular file (a directory, a device node, a FIFO, a socket) and, where ``is_ours``
    is given (a predicate on the existing file) and ``overwrite`` is false, a regular file that is
    not one of this package's (``is_ours(path)`` false).  Nothing is written.  Call it before the
    work whose result goes there, so that a bad path fails at once.
    """
    shown = os.fspath(path)

    def refuse(reason: str, errno=None):
        return UnsafePathError(what, shown, errno, reason)

    if not isinstance(shown, str):
        shown = os.fsdecode(shown)
    if shown == "":
        raise refuse("the path is empty")
    if shown.endswith(("/", os.sep)) or os.path.basename(shown) in ("", ".", ".."):
        raise refuse("the path names a directory (it ends with a slash); give a file name")
    folder, name = os.path.split(os.path.abspath(shown))
    if not os.path.isdir(folder):
        raise refuse(f"directory {folder} does not exist", 2)
    if len(os.fsencode(name)) > _name_max(folder):
        raise refuse(f"the file name is {len(os.fsencode(name))} bytes long, more than this file system allows "
                     f"({_name_max(folder)})", 36)  # fmt: skip
    try:
        st = os.lstat(shown)
    except FileNotFoundError:
        return shown
    except OSError as exc:
        raise refuse(exc.strerror or str(exc), exc.errno) from None
    if stat.S_ISLNK(st.st_mode):
        raise refuse("it is a symbolic link; refusing to write through it (remove the link, or give the path "
                     "it points to)")  # fmt: skip
    if stat.S_ISDIR(st.st_mode):
        raise refuse("it is a directory", 21)
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device node"
        raise refuse(f"it is {kind}, not a regular file; refusing to replace it")
    if is_ours is not None and not overwrite and not is_ours(shown):
        raise refuse(f"it exists and is not a {what}; refusing to overwrite it (remove it, choose another path, "
                     "or ask to overwrite it: --overwrite, save(..., overwrite=True))")  # fmt: skip
    return shown


def fsync_directory(folder: str) -> None:
    """``fsync`` a directory, so that a rename in it survives a crash (a no-op where unsupported)."""
    if os.name == "nt":  # Windows cannot open a directory as a file; NTFS journals renames
        return
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (e.g. some network mounts) refuse to fsync a directory
        pass
    finally:
        os.close(fd)


def _temporary_name(folder: str, name: str, suffix: str) -> str:
    # Hidden, and tied to the target's name: a crash leaves an obvious leftover, never a half file under the name.
    return os.path.join(folder, f".{_stem(name)}.{uuid.uuid4().hex[:12]}{suffix}")


def remove_leftovers(path) -> list[str]:
    """Delete the temporaries that interrupted writes of ``path`` left next to it; the names deleted.

    A process killed while writing (SIGKILL, a power cut) leaves its hidden
    ``.NAME.*.partial`` (a store), ``.NAME.*.old`` (a store being replaced) or
    ``.NAME.*.tmp`` (a file).  Call it only while holding :func:`exclusive_writer`
    for ``path``: then no other writer of ``path`` is running and they are all leftovers.
    """
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    pattern = re.compile(rf"^\.{re.escape(_stem(name))}\.[0-9a-f]{{12}}\.(partial|old|tmp)$")
    try:
        entries = sorted(e for e in os.listdir(folder) if pattern.match(e))
    except OSError:
        return []
    for entry in entries:
        full = os.path.join(folder, entry)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            _remove_quietly(full)
    return entries


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def atomic_file(path, what: str = "file", *, is_ours=None, overwrite: bool = False):
    """Write ``path`` atomically: yields a binary file object on a temporary file in the same folder.

    On leaving the block the file is flushed, ``fsync``-ed and renamed to
    ``path`` (replacing an older file, whose permission bits it keeps); the folder
    is then ``fsync``-ed.  If the block or the write raises, the temporary file is
    removed and ``path`` is left as it was; an ``OSError`` is raised as a
    :class:`WriteError` naming ``path`` (``what`` says what it is: ``"model file"``).

    Before anything is written, ``path`` is checked by :func:`check_output_path` (with
    ``is_ours`` and ``overwrite``): a symbolic link, a device node, a FIFO, a directory
    (and, with ``is_ours``, a file that is not this package's) is refused with an
    :class:`UnsafePathError`.  The temporary file is created with ``O_EXCL | O_NOFOLLOW``
    and renamed over ``path`` itself: a link put there meanwhile is replaced, never followed.
    """
    path = check_output_path(path, what, is_ours=is_ours, overwrite=overwrite)
    target = os.path.abspath(path)
    folder, name = os.path.split(target)
    tmp = _temporary_name(folder, name, ".tmp")
    try:
        mode = stat.S_IMODE(os.lstat(target).st_mode)
    except OSError:
        mode = None  # a new file: 0o666 less the umask, as open() gives
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_BINARY", 0)
        fd = os.open(tmp, flags, 0o666)
    except OSError as exc:
        raise WriteError.wrap(what, path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                with contextlib.suppress(OSError):  # not every file system keeps modes
                    os.chmod(tmp, mode)
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        _remove_quietly(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError.wrap(what, path, exc) from exc
        raise
    fsync_directory(folder)


@contextlib.contextmanager
def atomic_directory(path, what: str = "directory", *, replace: bool = False):
    """Create the directory ``path`` atomically: yields a temporary directory next to it to fill.

    On leaving the block the temporary directory is renamed to ``path``; with
    ``replace`` an existing ``path`` is first renamed aside and deleted only once
    the new one is in place (a crash between the two renames leaves it under a
    hidden ``.NAME.*.old`` name).  If the block raises, the temporary directory is
    deleted and ``path`` is left as it was; an ``OSError`` is raised as a
    :class:`WriteError` naming ``path``.

    The files inside are not ``fsync``-ed one by one (a store has many thousand);
    readers must check their content (the stores' chunk checksums do).
    """
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    if os.path.islink(path):
        raise UnsafePathError(what, path, None, "it is a symbolic link; refusing to replace it or write through it")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UnsafePathError(what, path, None, "it exists and is not a directory; refusing to replace it")
    tmp = _temporary_name(parent, name, ".partial")
    try:
        os.mkdir(tmp)
    except OSError as exc:
        raise WriteError.wrap(what, path, exc) from exc
    try:
        yield tmp
        fsync_directory(tmp)
        if os.path.lexists(path):
            if not replace:
                raise FileExistsError(17, "File exists")
            old = _temporary_name(parent, name, ".old")
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(old, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError.wrap(what, path, exc) from exc
        raise
    fsync_directory(parent)


class FileBusyError(OSError):
    """Another process is writing the same file (see :func:`exclusive_writer`)."""


#: Locks this process holds: target path -> [lock file descriptor, depth] (a nested fit takes the same lock).
_held: dict[str, list] = {}
_held_guard = threading.Lock()


def _lock_name(target: str) -> str:
    folder, name = os.path.split(target)
    return os.path.join(folder, f".{_stem(name)}.lock")


@contextlib.contextmanager
def exclusive_writer(path, what: str = "file"):
    """Hold the right to write ``path`` for the block: a second process asking for it fails at once.

    Two fits writing one model file or one checkpoint would otherwise overwrite each
    other's file in turn (each write is atomic, the last one wins).  The right is an
    advisory lock (``flock``) on a hidden ``.NAME.lock`` file next to ``path``, held
    by the process (so a process that dies, even by SIGKILL, releases it) and deleted
    on leaving the block.  Reentrant within a process.  Once it holds the right, the
    temporaries that killed writers of ``path`` left (:func:`remove_leftovers`) are
    deleted, with a warning naming them.  Where the system has no ``flock``
    (Windows) it does nothing.

    Raises
    ------
    FileBusyError
        Another process holds it: ``"PATH: another process (pid N) is writing this WHAT; ..."``.
    """
    if fcntl is None or path is None:  # pragma: no cover - Windows
        yield
        return
    target = os.path.abspath(os.fspath(path))  # not resolved: a link at the path is refused by the writer
    with _held_guard:
        entry = _held.get(target)
        if entry is not None:
            entry[1] += 1
    if entry is None:
        entry = [_acquire(target, os.fspath(path), what), 1]
        with _held_guard:
            _held[target] = entry
        removed = remove_leftovers(target)  # no other writer runs: what is there was left by killed ones
        if removed:
            warnings.warn(
                f"{os.fspath(path)}: removed what interrupted earlier writes of it left behind: {', '.join(removed)}",
                UserWarning,
                stacklevel=3,
            )
    try:
        yield
    finally:
        with _held_guard:
            entry[1] -= 1
            last = entry[1] == 0
            if last:
                del _held[target]
        if last:
            _remove_quietly(_lock_name(target))  # before the unlock: a waiter then locks a fresh file
            os.close(entry[0])


def _acquire(target: str, shown: str, what: str) -> int:
    lock = _lock_name(target)
    while True:
        try:  # never through a link, never blocking on a FIFO: a planted lock path cannot reach another file
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), 0o600)
        except OSError as exc:
            if os.path.islink(lock) or exc.errno == errno_module.ELOOP:
                raise UnsafePathError(what, shown, exc.errno, f"its lock file {lock} is a symbolic link; refusing to "
                                      "use it (remove it)") from None  # fmt: skip
            if exc.errno in (errno_module.ENXIO, errno_module.EISDIR):
                raise _not_a_lock(what, shown, lock) from None
            return os.open(os.devnull, os.O_RDONLY)  # a read-only folder: the write itself will fail, and say why
        try:
            st = os.fstat(fd)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > _MAX_LOCK_BYTES:
            os.close(fd)  # a device, a FIFO, a hard link to another file, a big file: not a lock, left as it is
            raise _not_a_lock(what, shown, lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = _read_owner(fd)
            os.close(fd)
            raise FileBusyError(
                f"{shown}: another process{owner} is writing this {what}; wait for it to finish, or choose another "
                f"path (the lock is {lock}, released when that process ends)"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except OSError:
            same = False
        if same:  # not a lock file its previous holder deleted while we waited for it
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


def _not_a_lock(what: str, shown: str, lock: str) -> UnsafePathError:
    return UnsafePathError(
        what, shown, None, f"{lock} is not a lock file of this package (not a small regular file with one link); "
        "refusing to use it (remove it)"
    )  # fmt: skip


def _read_owner(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {text})" if text.isdigit() else ""
