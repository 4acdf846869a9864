// Errors thrown by graphtrain. Every message names the thing at fault and what to do about it.
#pragma once

#include <stdexcept>
#include <string>

namespace graphtrain {

// Base of every error graphtrain throws; Python sees it as graphtrain.GraphtrainError.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A runtime option got a value it cannot accept (from the environment or the API).
class OptionError : public Error {
 public:
  using Error::Error;
};

}  // namespace graphtrain

namespace graphtrain {

// A graph is malformed: dangling value, cycle, type mismatch, unsupported construct.
class GraphError : public Error {
 public:
  using Error::Error;
};

// A model file cannot be read or written.
class ModelFileError : public Error {
 public:
  using Error::Error;
};

// Run-time input does not match what the graph declares (name, dtype, rank, dims).
class InputError : public Error {
 public:
  using Error::Error;
};

}  // namespace graphtrain
