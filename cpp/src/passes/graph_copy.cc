// Graph copies: a whole graph, or a subgraph of given nodes between given inputs and outputs (the
// gradient builder splits forward and backward with it).
#include <unordered_map>
#include <unordered_set>

#include "graphtrain/error.h"
#include "graphtrain/passes.h"

namespace graphtrain {

Graph extract_graph(const Graph& src, const std::vector<Node*>& nodes,
                    const std::vector<Value*>& inputs, const std::vector<Value*>& outputs,
                    const std::string& name) {
  Graph g;
  g.name = name;
  g.opset_imports = src.opset_imports;
  g.ir_version = src.ir_version;
  std::unordered_map<const Value*, Value*> map;
  for (Value* v : inputs) {
    Value* nv = g.add_input(v->name(), v->type);
    nv->sym_value = v->sym_value;
    map[v] = nv;
  }
  std::unordered_set<const Node*> inside(nodes.begin(), nodes.end());
  auto lookup = [&](Value* v) -> Value* {
    if (!v) return nullptr;
    auto it = map.find(v);
    if (it != map.end()) return it->second;
    if (v->is_initializer()) return map[v] = g.add_initializer(v->name(), v->initializer);
    Node* p = v->producer();
    if (p && p->op_type == "Constant" && p->domain.empty() && !inside.count(p)) {
      Node* c = g.add_node("Constant", {}, {v->name()}, "", p->name);
      c->attributes = p->attributes;
      c->outputs()[0]->type = v->type;
      c->outputs()[0]->sym_value = v->sym_value;
      return map[v] = c->outputs()[0];
    }
    throw GraphError("graph split: value '" + v->name() + "' is read in graph '" + name +
                     "' but neither produced there nor passed in");
  };
  for (Node* n : nodes) {
    std::vector<Value*> ins;
    for (Value* in : n->inputs()) ins.push_back(lookup(in));
    std::vector<std::string> outs;
    for (Value* out : n->outputs()) outs.push_back(out ? out->name() : "");
    Node* c = g.add_node(n->op_type, ins, outs, n->domain, n->name);
    c->attributes = n->attributes;
    c->scope = n->scope;
    for (size_t i = 0; i < n->outputs().size(); ++i)
      if (Value* o = n->outputs()[i]) {
        c->outputs()[i]->type = o->type;
        c->outputs()[i]->sym_value = o->sym_value;
        map[o] = c->outputs()[i];
      }
  }
  for (Value* v : outputs) g.add_output(lookup(v));
  return g;
}

Graph clone_graph(const Graph& graph) {
  std::vector<Value*> inputs = graph.inputs();
  return extract_graph(graph, graph.topological_order(), inputs, graph.outputs(), graph.name);
}

}  // namespace graphtrain
