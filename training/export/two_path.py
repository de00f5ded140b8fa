"""The ``If`` choices of the served graph, and the two-path model's graph surgery.

``with_unpruned_branch`` joins the traced pruned and unpruned passes: ``If(every row's ρ ≥ 1, unpruned,
pruned)``, each weight stored once. A model whose pruned branch has weights of its own (a two-path model)
gets a second choice below it (``with_both_paths_branch``: some row at ρ ≥ 1, both paths, each row taking
its own; else the copy's pruned pass alone), the weights only its ρ < 1 side reads beside that pass
(``with_weights_beside_their_pass``), and its cost read off the branches (``branch_reads``,
``copy_only_bytes``). ``unjoined`` takes a joined graph apart again (int8 quantizes each branch as the
standalone graph it was traced as).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import onnx

# The scorers' nodes as the tracer names them: at the top (``/scorers.0/…``) or under a branch's prefix
# (the two-path graph's mixed-batch pass: ``both//scorers.0/…``).
SCORER_SCOPES = ("/scorers.",)


def scorer_node(node: str) -> bool:
    """A node of the scorers (``SCORER_SCOPES``), wherever the tracer put it."""
    return any(scope in node for scope in SCORER_SCOPES)


UNPRUNED_SCOPE = "unpruned/"  # names inside the unpruned branch (values, nodes, its own weights)
PRUNED_SCOPE = "pruned/"  # the pruned branch's outputs (its inner names are the traced ones)


@dataclass(frozen=True)
class Choice:
    """One ``If`` the export puts over two traced graphs: ``reduce``(rho) ≥ 1 picks ``then``; the names
    of its values and nodes (unique in the whole model: a second choice nests in the first's branch)."""

    reduce: str  # ReduceMin: every row asks ρ ≥ 1; ReduceMax: some row does
    reduced: str
    one: str
    condition: str
    node: str
    then_scope: str  # the then branch's values, nodes, outputs and its own weights
    else_outputs: str  # the else branch's outputs (its inner names are the traced ones)


EVERY_ROW_DENSE = Choice(
    "ReduceMin",
    "rho_min",
    "rho_one",
    "every_rho_is_1",
    "unpruned_if_every_rho_is_1",
    UNPRUNED_SCOPE,
    PRUNED_SCOPE,
)
SOME_ROW_DENSE = Choice(  # below EVERY_ROW_DENSE, in a model whose pruned branch has weights of its own
    "ReduceMax", "rho_max", "rho_one_of_max", "some_rho_is_1", "both_paths_if_some_rho_is_1", "both/", "copy/"
)
CHOICES = {choice.node: choice for choice in (EVERY_ROW_DENSE, SOME_ROW_DENSE)}


def with_unpruned_branch(pruned: Any, unpruned: Any) -> Any:
    """One model: ``If(ReduceMin(rho) ≥ 1, then=unpruned graph, else=pruned graph)``, the two traced
    graphs as its branches. Weights live once, in the outer graph: the unpruned branch reads the pruned
    graph's initializer of identical bytes where there is one (every weight of the dense model), its own
    otherwise. The outer graph keeps the pruned graph's inputs and outputs, names and types."""
    return joined(EVERY_ROW_DENSE, unpruned, pruned)


def with_both_paths_branch(pruned: Any, both: Any) -> Any:
    """A two-path model's ρ < 1 side: ``If(ReduceMax(rho) ≥ 1, then=both paths, else=the copy's pruned
    pass)``; weights once, as in ``with_unpruned_branch`` (the copy's are the outer graph's)."""
    return joined(SOME_ROW_DENSE, both, pruned)


def joined(choice: Choice, then: Any, otherwise: Any) -> Any:
    """``If(choice.reduce(rho) ≥ 1, then, otherwise)`` as one model with ``otherwise``'s inputs, outputs
    and initializers, plus ``then``'s initializers no ``otherwise`` initializer has the bytes of."""
    from onnx import helper

    outer = otherwise.graph
    inputs = {graph_input.name for graph_input in outer.input}
    shared = {_initializer_key(init): init.name for init in outer.initializer}
    renames: dict[str, str] = {init.name: init.name for init in outer.initializer}
    then_renames: dict[str, str] = {}
    lifted = []
    for init in then.graph.initializer:
        target = shared.get(_initializer_key(init))
        if target is None:
            target = choice.then_scope + init.name
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = target
            lifted.append(copy)
        then_renames[init.name] = target
    one = helper.make_tensor("one", onnx.TensorProto.FLOAT, [], [1.0])
    nodes = [
        helper.make_node(choice.reduce, ["rho"], [choice.reduced], name=choice.reduced, keepdims=0),
        helper.make_node("Constant", [], [choice.one], name=choice.one, value=one),
        helper.make_node(
            "GreaterOrEqual", [choice.reduced, choice.one], [choice.condition], name=choice.condition
        ),
        helper.make_node(
            "If",
            [choice.condition],
            [output.name for output in outer.output],
            name=choice.node,
            then_branch=_branch(then.graph, inputs, then_renames, choice.then_scope, choice.then_scope),
            else_branch=_branch(outer, inputs, renames, "", choice.else_outputs),
        ),
    ]
    graph = helper.make_graph(
        nodes, outer.name, list(outer.input), list(outer.output), [*outer.initializer, *lifted]
    )
    model = helper.make_model(graph, opset_imports=list(otherwise.opset_import))
    model.ir_version = otherwise.ir_version
    return model


def with_weights_beside_their_pass(model: Any) -> Any:
    """A two-path graph with the initializers only its ρ < 1 side reads (the copy's weights, the scorers)
    moved from the outer graph into the outer ``If``'s else branch, one level above the copy's pass: left
    two levels up they were not prepacked (the pass took 1.06–1.07× the frozen graph's seconds, as the
    frozen graph does with prepacking off, and ran other kernels: outputs ~3e-7 apart;
    docs/experiments/2026-11-28-pruned-branch.md, "The two-path graph's speed"). A one-path graph is
    returned as it is (its bytes unchanged)."""
    reads = branch_reads(model)
    if reads is None:
        return model
    placed = onnx.ModelProto()
    placed.CopyFrom(model)
    choice = {node.name: node for node in placed.graph.node}[EVERY_ROW_DENSE.node]
    outside = {value for node in placed.graph.node if node is not choice for value in node.input}
    outside |= {value for node in all_nodes(branch_of(choice, "then_branch")) for value in node.input}
    below = branch_of(choice, "else_branch")
    below_reads = {value for node in all_nodes(below) for value in node.input}
    moving = {init.name for init in placed.graph.initializer} & below_reads - outside
    staying = [init for init in placed.graph.initializer if init.name not in moving]
    below.initializer.extend(init for init in placed.graph.initializer if init.name in moving)
    del placed.graph.initializer[:]
    placed.graph.initializer.extend(staying)
    return placed


def _initializer_key(init: Any) -> tuple[int, tuple[int, ...], str]:
    """An initializer's identity by content: dtype, shape and a digest of its values."""
    import hashlib

    from onnx import numpy_helper

    digest = hashlib.sha1(numpy_helper.to_array(init).tobytes()).hexdigest()
    return init.data_type, tuple(init.dims), digest


def _branch(graph: Any, inputs: set[str], weights: dict[str, str], scope: str, output_scope: str) -> Any:
    """``graph``'s nodes as an If branch: outer inputs and weights referenced by their outer names,
    every other value under ``scope``, the outputs under ``output_scope`` (a branch may not reuse the
    outer graph's names)."""
    from onnx import helper

    outputs = {output.name for output in graph.output}

    def name_of(value: str) -> str:
        if not value or value in inputs:
            return value
        if value in weights:
            return weights[value]
        return (output_scope if value in outputs else scope) + value

    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = scope + node.name
        copy.input[:] = [name_of(value) for value in node.input]
        copy.output[:] = [name_of(value) for value in node.output]
        nodes.append(copy)
    branch_outputs = []
    for output in graph.output:
        renamed = onnx.ValueInfoProto()
        renamed.CopyFrom(output)
        renamed.name = name_of(output.name)
        branch_outputs.append(renamed)
    return helper.make_graph(nodes, f"{output_scope.strip('/')}_branch", [], branch_outputs)


def unjoined(model: Any) -> tuple[Any, Any] | None:
    """The two standalone graphs ``joined`` joined (else, then: pruned and unpruned for
    ``with_unpruned_branch``), each with the outer inputs, the outer outputs' names and the weights its
    nodes (and their branches) read; None for a graph without one of our ``If`` choices."""
    from onnx import helper

    outer = model.graph
    choices = [node for node in outer.node if node.op_type == "If"]
    if len(choices) != 1 or choices[0].name not in CHOICES:
        return None
    branches = {attribute.name: attribute.g for attribute in choices[0].attribute}
    weights = {init.name: init for init in outer.initializer}
    standalone = []
    for key in ("else_branch", "then_branch"):
        branch = branches[key]
        names = {output.name: final.name for output, final in zip(branch.output, outer.output, strict=True)}
        nodes = []
        for node in branch.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [names.get(value, value) for value in node.input]
            copy.output[:] = [names.get(value, value) for value in node.output]
            nodes.append(copy)
        read = {value for node in nodes for inner in all_nodes_of(node) for value in inner.input}
        graph = helper.make_graph(
            nodes,
            branch.name,
            list(outer.input),
            list(outer.output),
            # the branch's own weights (with_weights_beside_their_pass), then the outer ones it reads
            [*branch.initializer, *(weights[name] for name in weights if name in read)],
        )
        part = helper.make_model(graph, opset_imports=list(model.opset_import))
        part.ir_version = model.ir_version
        standalone.append(part)
    return standalone[0], standalone[1]


def all_nodes(graph: Any) -> Iterator[Any]:
    """Every node of ``graph`` and of the graphs its nodes hold (If branches), depth first."""
    for node in graph.node:
        yield from all_nodes_of(node)


def all_nodes_of(node: Any) -> Iterator[Any]:
    """``node`` and every node of the graphs it holds (an If's branches), depth first."""
    yield node
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield from all_nodes(attribute.g)


def branch_reads(model: Any) -> tuple[set[str], set[str]] | None:
    """(the initializers the copy's pruned pass reads, the scorers' excepted; those the ρ = 1 branch
    reads) of a two-path graph, fp32 or int8; None for a one-path graph. Traced node names do not tell
    the copy's operators from the original's (both are ``/layers.N/…``): the branches do."""
    outer = {node.name: node for node in model.graph.node}.get(EVERY_ROW_DENSE.node)
    if outer is None:
        return None
    unpruned, below = (branch_of(outer, key) for key in ("then_branch", "else_branch"))
    inner = {node.name: node for node in below.node}.get(SOME_ROW_DENSE.node)
    if inner is None:
        return None
    copy_pass = branch_of(inner, "else_branch")
    copy_reads = {
        value for node in all_nodes(copy_pass) if not scorer_node(node.name) for value in node.input
    }
    return copy_reads, {value for node in all_nodes(unpruned) for value in node.input}


def branch_of(node: Any, key: str) -> Any:
    return next(attribute.g for attribute in node.attribute if attribute.name == key)


def copy_only_bytes(model: Any) -> int:
    """Bytes of the initializers the copy's pruned pass reads and the ρ = 1 branch does not: the copy's
    weights (an initializer it shares by content with the original, a table training left as it was, is
    stored once and not counted); 0 for a one-path graph."""
    from onnx import numpy_helper

    reads = branch_reads(model)
    if reads is None:
        return 0
    copy_reads, original_reads = reads
    outer = {node.name: node for node in model.graph.node}[EVERY_ROW_DENSE.node]
    below = branch_of(outer, "else_branch").initializer  # with_weights_beside_their_pass put them there
    weights = {init.name: init for init in [*model.graph.initializer, *below]}
    return sum(
        numpy_helper.to_array(weights[name]).nbytes for name in copy_reads - original_reads if name in weights
    )
