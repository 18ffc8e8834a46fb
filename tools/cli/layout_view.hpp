// Presentation of a ScaleLayout for the CLI: the physical buffer as a grid of labelled cells.
// Positions come from ScaleLayout::offset() only; this file never restates a layout formula.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::cli {

struct Cell {
  int64_t row = -1;  ///< first data row whose scale lives here (-1: padding)
  int64_t kb = -1;   ///< K-block
};

/// Cells of the buffer positions [0, limit): which (row, K-block) each one holds.
std::vector<Cell> buffer_cells(const layouts::ScaleLayout& l, int64_t limit);

/// Natural line width for drawing the buffer: 16 for 128x4 tiles (one 16-byte row of a tile), the
/// padded row count for outer-major block1x128, else the padded K-block count.
int64_t buffer_line_width(const layouts::ScaleLayout& l);

/// Human text of the offset formula of a layout (documentation; the code path is offset()).
std::string formula_text(const layouts::ScaleLayout& l);

}  // namespace scalemm::cli
