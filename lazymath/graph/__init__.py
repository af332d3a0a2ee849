"""Layer 2, the lazy DAG: interned nodes with structural hashes (`node`), the op tables
(`ops`), the numpy reference executor (`reference`) and the structural signature used as the
program-cache key (`signature`)."""

from .node import Node, buffer_node, const_node, make, toposort

__all__ = ["Node", "buffer_node", "const_node", "make", "toposort"]
