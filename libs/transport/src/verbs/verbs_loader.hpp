// rdma-core is loaded at run time (see verbs_loader.cpp): whether it could be.
#pragma once

#include <string>

namespace plexus::transport::internal {

// True when libibverbs.so.1 and librdmacm.so.1 are loaded (the first call loads them); false
// with the reason (the library that is missing and the package to install) otherwise.
bool VerbsLibrariesLoaded(std::string* why_not);

}  // namespace plexus::transport::internal
