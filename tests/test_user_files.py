"""Files a user names on the command line (issue 36): an --output that is a device, FIFO or link is never
replaced by a rename (``files.write_file``), and an --input .npy whose header claims more than the file holds
is refused before anything is allocated."""
import os
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.files import write_file


def _save(fh):
    np.save(fh, np.arange(4, dtype=np.float32))


def test_a_regular_output_is_replaced_whole_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "y.npy"
    p.write_bytes(b"old")
    write_file(p, _save, "--output")
    assert np.load(p).tolist() == [0, 1, 2, 3] and os.listdir(tmp_path) == ["y.npy"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "y.npy"
    p.write_bytes(b"old")

    def boom(fh):
        fh.write(b"half")
        raise OSError(28, "No space left on device")
    with pytest.raises(TunerError, match="No space left"):
        write_file(p, boom, "--output")
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["y.npy"]


def test_a_fifo_is_written_through_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # the reader there before the write (a thread's blocking open could come after it under load, and the write
    # then refuses a FIFO that no one reads); the .npy fits in the pipe's buffer, read once the writer closed
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    write_file(fifo, _save, "--output")
    with os.fdopen(rfd, "rb") as r:
        got = r.read()
    assert np.load(__import__("io").BytesIO(got)).tolist() == [0, 1, 2, 3]
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # still the FIFO


def test_dev_null_stays_a_device():
    write_file("/dev/null", _save, "--output")
    import stat
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"keep")
    link = tmp_path / "y.npy"
    link.symlink_to(target)
    with pytest.raises(TunerError, match="symbolic link"):
        write_file(link, _save, "--output")
    assert target.read_bytes() == b"keep" and link.is_symlink()


def test_tuner_run_output_to_dev_null_and_a_huge_npy_header(tmp_path, capsys):
    """The CLI: `tuner run --output /dev/null` leaves /dev/null a device; an input whose header claims
    shape (2**40,) exits 2 with a message, no MemoryError."""
    import stat

    import tuner
    from tuner.cli import main
    from tuner.zoo.models import test_models
    art = tuner.compile_model(test_models()["add"], scope="buffer").save(tmp_path / "a")
    assert main(["run", str(art), "--output", "/dev/null", "--repeat", "1"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    bad = tmp_path / "x.npy"
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.float32))
    header["shape"] = (2 ** 40,)
    with open(bad, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(b"\0" * 16)
    capsys.readouterr()
    assert main(["run", str(art), "--input", str(bad), "--repeat", "1"]) == 2
    err = capsys.readouterr().err
    assert "header says shape (1099511627776,)" in err and "Traceback" not in err


def test_every_writer_refuses_a_link_and_writes_through_a_device(tmp_path, capsys):
    """The same rule for every file a command writes (issue 36): `tuner zoo -o`, `tuner logs -o` and `tuner
    report -o` refuse a symbolic link (its target untouched) and leave /dev/null a device."""
    import stat

    from tuner.cli import main
    target = tmp_path / "precious"
    target.write_bytes(b"keep")
    link = tmp_path / "out"
    link.symlink_to(target)
    log = min(Path(__file__).resolve().parents[1].glob("logs/*.jsonl"), key=lambda p: p.stat().st_size)
    for argv in (["zoo", "resnet18", "--input-size", "32"], ["logs", str(log)], ["report", str(log)]):
        capsys.readouterr()
        assert main([*argv, "-o", str(link)]) == 2, argv
        assert "symbolic link" in capsys.readouterr().err, argv
        assert target.read_bytes() == b"keep" and link.is_symlink()
    assert main(["zoo", "resnet18", "--input-size", "32", "-o", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
