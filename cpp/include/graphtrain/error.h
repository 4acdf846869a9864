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
