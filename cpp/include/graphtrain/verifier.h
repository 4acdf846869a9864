#pragma once

#include "graphtrain/graph.h"

namespace graphtrain {

// Checks a graph's structure and throws GraphError naming the first problem: a value used but
// never produced, a graph output nothing produces, a cycle, inputs of one op with different
// element types where the op requires one type.
void verify(const Graph& graph);

}  // namespace graphtrain
