#include <scalemm/scalemm.h>
#include <scalemm/scalemm.hpp>

#include <cstdio>
#include <cstring>

int main() {
  const auto r = scalemm::parse_recipe("block128x128");
  if (!r || *r != scalemm::Recipe::kBlock128x128) return 1;
  if (std::strcmp(scalemm_version(), SCALEMM_VERSION_STRING) != 0) return 2;
  std::printf("consumer linked scalemm %s\n", scalemm_version());
  return 0;
}
