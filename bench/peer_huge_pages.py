"""Imported by the PyTorch peer scripts in bench/ before torch: PyTorch's
CPU allocator advises its large blocks MADV_HUGEPAGE when
THP_MEM_ALLOC_ENABLE is 1 (read at its first allocation), so the peer gets
transparent huge pages as dtrain's big buffers do. THP_MEM_ALLOC_ENABLE=0 in
the environment keeps 4 KiB pages."""
import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
