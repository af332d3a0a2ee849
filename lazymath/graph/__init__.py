"""Layer 2, the lazy DAG: interned nodes with structural hashes (`node`), the op tables
(`ops`), the numpy reference executor (`reference`) and the structural signature used as the
program-cache key (`signature`)."""

from lazymath.graph.node import Node, buffer_node, const_node, make, toposort

__all__ = ["Node", "buffer_node", "const_node", "make", "to_networkx", "toposort"]


def to_networkx(*tensors):
    """The pending graph behind `tensors` as a `networkx.DiGraph` (plain data for any tool:
    nodes carry op, dtype, shape, arg and the user's line; edges carry the operand index).

    networkx is imported here only, so realizing never pays for it."""
    import networkx as nx

    roots = [getattr(t, "_node", t) for t in tensors]
    g = nx.DiGraph()
    for n in toposort(roots):
        g.add_node(id(n), op=n.op, dtype=n.dtype.name, shape=n.shape, arg=n.arg, loc=n.loc,
                   realized=n.realized is not None)  # fmt: skip
        for i, s in enumerate(n.srcs):
            g.add_edge(id(s), id(n), operand=i)
    return g
