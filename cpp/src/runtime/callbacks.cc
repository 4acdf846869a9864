// Callback nodes (see graphtrain/callback.h): the host program's function, and the PythonOp
// shape-inferer registry. The kernel that calls the host is kernels/cpu/callbacks.cc.
#include "graphtrain/callback.h"

#include <map>
#include <mutex>
#include <shared_mutex>

#include "graphtrain/error.h"
#include "graphtrain/ops.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

struct Host {
  std::shared_mutex mutex;
  HostCallback fn;
};

Host& host() {
  static Host h;
  return h;
}

struct InfererRegistry {
  std::mutex mutex;
  std::map<std::string, PythonOpInferer> by_name;
};

InfererRegistry& inferers() {
  static InfererRegistry r;
  return r;
}

}  // namespace

void set_host_callback(HostCallback fn) {
  std::unique_lock lock(host().mutex);
  host().fn = std::move(fn);
}

HostCallback host_callback() {
  std::shared_lock lock(host().mutex);
  return host().fn;
}

bool is_callback_op(const Node& node) {
  if (node.domain != kGraphtrainDomain) return false;
  for (const char* op : kCallbackOps)
    if (node.op_type == op) return true;
  return false;
}

void register_python_op_inferer(const std::string& func_name, PythonOpInferer fn) {
  std::lock_guard lock(inferers().mutex);
  if (fn)
    inferers().by_name[func_name] = std::move(fn);
  else
    inferers().by_name.erase(func_name);
}

PythonOpInferer find_python_op_inferer(const std::string& func_name) {
  std::lock_guard lock(inferers().mutex);
  auto it = inferers().by_name.find(func_name);
  return it == inferers().by_name.end() ? PythonOpInferer() : it->second;
}

}  // namespace graphtrain
