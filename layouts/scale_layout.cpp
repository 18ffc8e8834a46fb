#include "scalemm/layouts/scale_layout.hpp"

#include <sstream>

namespace scalemm::layouts {

std::string ScaleLayout::shape_stride_string() const {
  std::ostringstream os;
  if (format == ScaleFormat::kCublasLt && recipe == Recipe::kBlock1x128) {
    // Outer-major: the K-block index is the slow one.
    os << '(' << padded_rows() << ',' << padded_kblocks() << "):(1," << padded_rows() << ')';
  } else if (format == ScaleFormat::kCublasLt && recipe_is_tiled(recipe)) {
    os << '(' << padded_rows() << ',' << padded_kblocks() << "):128x4 tiles";
  } else {
    os << '(' << padded_rows() << ',' << padded_kblocks() << "):(" << padded_kblocks() << ",1)";
  }
  return os.str();
}

std::string ScaleLayout::to_string() const {
  std::ostringstream os;
  os << scalemm::to_string(recipe) << " scales of a " << rows << 'x' << k << " operand, "
     << scalemm::to_string(format) << ": " << scalemm::to_string(scale_dtype()) << ' '
     << shape_stride_string() << ", " << size() << " elements, " << bytes() << " B";
  return os.str();
}

}  // namespace scalemm::layouts
