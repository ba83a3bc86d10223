// plexus-drx's placement subcommand: Fianchetto's placement study on netmodel's DRX model.
#pragma once

#include <vector>

#include "plexus/netmodel/drx_placement.hpp"

namespace plexus::drxtool {

struct PlacementArgs {
  bool json = false;
  std::vector<int> apps = {1, 5, 10, 15};
  std::vector<int> accelerators = {4, 8, 16, 32};
  netmodel::DrxFabric fabric;
};

// Prints the table (or --json lines); returns the exit code.
int RunPlacement(const PlacementArgs& args);

}  // namespace plexus::drxtool
