"""The compiled-model artifact: the contract between the compiler and every runtime (docs/artifact.md).

``format`` holds its types and their strict JSON form, ``checks`` the checks a runtime makes before it
allocates anything, ``store`` the atomic writer and the verifying reader. Nothing here opens a device."""

from .checks import check_spec
from .format import FORMAT, VERSION, ArtifactError, Blob, Call, Entry, ModuleSpec, Node, Param, Pool
from .store import BINARIES, kernel_file, read_artifact, write_artifact

__all__ = ["FORMAT", "VERSION", "ArtifactError", "Blob", "Call", "Entry", "ModuleSpec", "Node", "Param", "Pool",
           "BINARIES", "check_spec", "kernel_file", "read_artifact", "write_artifact"]
