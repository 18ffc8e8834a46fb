// `scalemm layout explain|render` (check and convert are registered next to them).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "scalemm/grouped.hpp"
#include "cli_io.hpp"
#include "scalemm/io/output_file.hpp"
#include "layout_view.hpp"
#include "scalemm/io/npy.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/status.hpp"

namespace scalemm::cli {

using layouts::ScaleLayout;

std::vector<Cell> buffer_cells(const ScaleLayout& l, int64_t limit) {
  limit = std::min(limit, l.size());
  std::vector<Cell> cells(static_cast<size_t>(std::max<int64_t>(limit, 0)));
  for (int64_t r = l.rows - 1; r >= 0; --r) {  // descending so the first row of a block wins
    for (int64_t kb = 0; kb < l.kblocks(); ++kb) {
      const int64_t pos = l.offset(r, kb);
      if (pos < limit) cells[static_cast<size_t>(pos)] = Cell{r, kb};
    }
  }
  return cells;
}

int64_t buffer_line_width(const ScaleLayout& l) {
  if (l.format == ScaleFormat::kCublasLt && layouts::recipe_is_tiled(l.recipe)) return 16;
  if (l.format == ScaleFormat::kCublasLt && l.recipe == Recipe::kBlock1x128) return l.padded_rows();
  return std::max<int64_t>(l.padded_kblocks(), 1);
}

std::string formula_text(const ScaleLayout& l) {
  const bool c = l.format == ScaleFormat::kCompact;
  switch (l.recipe) {
    case Recipe::kTensorwise: return "offset(r, kb) = 0";
    case Recipe::kRowwise: return "offset(r, kb) = r";
    case Recipe::kBlock1x128:
      return c ? "offset(r, kb) = r*L + kb, L = ceil(K/128)"
               : "offset(r, kb) = kb*R4 + r, R4 = roundup(R,4) (outer-major, VEC128_32F)";
    case Recipe::kBlock128x128:
      return c ? "offset(r, kb) = (r/128)*L + kb, L = ceil(K/128)"
               : "offset(r, kb) = (r/128)*L4 + kb, L4 = roundup(ceil(K/128),4) (K-major, BLK128x128_32F)";
    case Recipe::kMxfp8:
    case Recipe::kNvfp4:
    case Recipe::kMxfp8_32x32: {
      const char* s = l.recipe == Recipe::kNvfp4 ? "S = ceil(K/16)" : "S = ceil(K/32)";
      if (c) return std::string(l.recipe == Recipe::kMxfp8_32x32 ? "offset(r, kb) = (r/32)*S + kb, "
                                                                    : "offset(r, kb) = r*S + kb, ") + s;
      return std::string("offset(r, s) = ((r/128)*(S4/4) + s/4)*512 + (r%32)*16 + ((r%128)/32)*4 + s%4, ") +
             s + ", S4 = roundup(S,4), rows padded to roundup(R,128)" +
             (l.recipe == Recipe::kMxfp8_32x32 ? " (each 32x32 scale replicated to its 32 rows)" : "");
    }
  }
  return "";
}

namespace {

struct LayoutArgs {
  std::string recipe;
  int64_t rows = 0;
  int64_t cols = 0;
};

void add_layout_args(CLI::App* cmd, LayoutArgs& a) {
  cmd->add_option("--recipe", a.recipe, "Scaling recipe: " + all_recipe_names())->required();
  cmd->add_option("--rows", a.rows, "Operand rows R (M for A, N for B)")
      ->required()
      ->check(whole_number(1, kMaxExtent, "the operand's rows: M for A, N for B"));
  cmd->add_option("--cols", a.cols, "Reduction length K in elements")
      ->required()
      ->check(whole_number(1, kMaxExtent, "the reduction length K in elements"));
}

ScaleLayout make_layout(const LayoutArgs& a, ScaleFormat f) {
  const ScaleLayout l(parse_recipe_or_throw(a.recipe, "--recipe"), a.rows, a.cols, f);
  check_layout_extent(l);
  return l;
}

nlohmann::json layout_json(const ScaleLayout& l) {
  nlohmann::json j;
  j["format"] = std::string(to_string(l.format));
  j["shape"] = {l.padded_rows(), l.padded_kblocks()};
  j["layout"] = l.shape_stride_string();
  j["elements"] = l.size();
  j["bytes"] = l.bytes();
  j["offset"] = formula_text(l);
  return j;
}

// Number of buffer positions that no (r, kb) reaches.
int64_t padding_count(const ScaleLayout& l) {
  std::vector<char> used(static_cast<size_t>(l.size()), 0);
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t kb = 0; kb < l.kblocks(); ++kb) used[static_cast<size_t>(l.offset(r, kb))] = 1;
  return static_cast<int64_t>(std::count(used.begin(), used.end(), 0));
}

std::string cell_label(const Cell& c) {
  if (c.row < 0) return "  .  ";
  std::ostringstream os;
  os << c.row << ':' << c.kb;
  std::string s = os.str();
  if (s.size() < 5) s = std::string(5 - s.size(), ' ') + s;
  return s;
}

void print_map(std::ostream& os, const ScaleLayout& l, int64_t max_lines) {
  const int64_t width = buffer_line_width(l);
  const int64_t shown_width = std::min<int64_t>(width, 16);
  const int64_t lines = std::min<int64_t>(max_lines, (l.size() + width - 1) / std::max<int64_t>(width, 1));
  auto cells = buffer_cells(l, lines * width);
  os << "  buffer map (row:kblock at each position; '.' = zero padding";
  if (shown_width < width) os << "; first " << shown_width << " of " << width << " per line";
  os << "):\n";
  for (int64_t line = 0; line < lines; ++line) {
    os << "  " << std::setw(6) << line * width << " |";
    for (int64_t i = 0; i < shown_width; ++i) {
      const int64_t pos = line * width + i;
      os << ' ' << (pos < static_cast<int64_t>(cells.size()) ? cell_label(cells[static_cast<size_t>(pos)]) : "     ");
    }
    os << '\n';
  }
  if (lines * width < l.size()) os << "  ... " << l.size() - lines * width << " more positions\n";
}

// --group-sizes of `layout explain|render`: non-negative rows adding up to --rows.
void check_group_rows(const std::vector<int64_t>& sizes, int64_t rows) {
  int64_t sum = 0;
  for (int64_t v : sizes) {
    if (v < 0)
      throw Error(StatusCode::kInvalidArgument, "--group-sizes: a group size cannot be negative, got " + std::to_string(v));
    sum += v;
  }
  if (sum != rows)
    throw Error(StatusCode::kInvalidArgument, "--group-sizes: the sizes add up to " + std::to_string(sum) +
                                                  ", expected --rows = " + std::to_string(rows) +
                                                  " (the rows of the grouped operand)");
}

// A rendered picture goes through io::write_output, as every output does.
void write_rendered(const std::string& out, const std::string& text) { io::write_output(out, {text}, "--out"); }

// The scale buffers of an m-grouped A (grouped.hpp): each group's own buffer, in group order.
void run_explain_grouped(const LayoutArgs& a, const std::string& sizes_text, const std::string& format, bool json) {
  const std::vector<int64_t> sizes = parse_group_sizes(sizes_text);
  GroupedGemmArgs g;
  g.groups = int64_t(sizes.size());
  g.group_sizes = sizes.data();
  g.m = a.rows, g.n = 1, g.k = a.cols;
  g.a.recipe = parse_recipe_or_throw(a.recipe, "--recipe");
  g.a.scale_format = parse_scale_format_or_throw(format, "--format");
  check_group_rows(sizes, a.rows);
  const std::vector<int64_t> offs = grouped_scale_offsets(g);
  nlohmann::json groups = nlohmann::json::array();
  std::ostringstream os;
  os << to_string(g.a.recipe) << " scales of an m-grouped A, " << a.rows << " rows in " << sizes.size()
     << " groups, K=" << a.cols << ", " << format << " format: each group's own buffer, in group order"
     << (g.a.scale_format == ScaleFormat::kCublasLt ? ", each starting on a 16-byte boundary" : "") << "\n";
  int64_t r0 = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const ScaleLayout l(g.a.recipe, sizes[i], a.cols, g.a.scale_format);
    groups.push_back({{"group", i}, {"rows", {r0, r0 + sizes[i]}}, {"byte_offset", offs[i]}, {"bytes", l.bytes()},
                      {"layout", l.shape_stride_string()}});
    os << "  group " << i << ": rows [" << r0 << ", " << r0 + sizes[i] << "), bytes [" << offs[i] << ", "
       << offs[i] + l.bytes() << "), " << l.shape_stride_string() << "\n";
    r0 += sizes[i];
  }
  os << "  total " << offs.back() << " bytes (B of an m-grouped call: G buffers of one (N, K) operand, "
     << "each starting on a 16-byte boundary in cublaslt format)\n";
  if (json) {
    std::cout << nlohmann::json{{"recipe", std::string(to_string(g.a.recipe))}, {"format", format},
                                {"rows", a.rows}, {"k", a.cols}, {"groups", groups}, {"bytes", offs.back()}}
                     .dump(2)
              << '\n';
    return;
  }
  std::cout << os.str();
}

void run_explain(const LayoutArgs& a, bool json) {
  const ScaleLayout compact = make_layout(a, ScaleFormat::kCompact);
  const ScaleLayout lt = compact.with_format(ScaleFormat::kCublasLt);
  if (json) {
    nlohmann::json j;
    j["recipe"] = std::string(to_string(compact.recipe));
    j["rows"] = a.rows;
    j["k"] = a.cols;
    j["block"] = {compact.block_rows(), compact.block_k()};
    j["scale_dtype"] = std::string(to_string(compact.scale_dtype()));
    j["grid"] = {compact.grid_rows(), compact.kblocks()};
    j["compact"] = layout_json(compact);
    j["compact"]["padding_elements"] = padding_count(compact);
    j["cublaslt"] = layout_json(lt);
    j["cublaslt"]["padding_elements"] = padding_count(lt);
    std::cout << j.dump(2) << '\n';
    return;
  }
  std::ostream& os = std::cout;
  os << to_string(compact.recipe) << " scales for an operand of " << a.rows << " rows x K=" << a.cols << '\n';
  os << "  block " << compact.block_rows() << 'x' << compact.block_k() << ", scale dtype "
     << to_string(compact.scale_dtype()) << ", logical grid " << compact.grid_rows() << " x "
     << compact.kblocks() << " (" << compact.logical_size() << " scales)\n";
  for (const ScaleLayout* l : {&compact, &lt}) {
    os << '\n' << to_string(l->format) << ": " << l->shape_stride_string() << ", " << l->size()
       << " elements, " << l->bytes() << " bytes, " << padding_count(*l) << " padding elements (zero)\n";
    os << "  " << formula_text(*l) << '\n';
    // The whole first 128x4 tile (512 positions, 32 lines of 16) for tiled layouts.
    print_map(os, *l, l->format == ScaleFormat::kCublasLt && layouts::recipe_is_tiled(l->recipe) ? 32 : 6);
  }
}

// Colours: hue by K-block, lightness alternating by row block, grey for padding.
std::string cell_colour(const ScaleLayout& l, const Cell& c) {
  if (c.row < 0) return "#dddddd";
  const int64_t row_block = c.row / std::max<int64_t>(l.block_rows() > 1 ? l.block_rows() : 32, 1);
  const int hue = static_cast<int>((c.kb * 67) % 360);
  const int light = row_block % 2 ? 62 : 78;
  std::ostringstream os;
  os << "hsl(" << hue << ",70%," << light << "%)";
  return os.str();
}

// SVG text is not measured by the renderer, so the canvas is sized from the character count:
// a monospace glyph advances 0.602 em in DejaVu Sans Mono and about 0.6 em in the others.
constexpr double kGlyphEm = 0.62;

int64_t text_px(const std::string& s, int font_size) {
  return static_cast<int64_t>(std::ceil(double(s.size()) * kGlyphEm * font_size));
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// Greedy word wrap to `max_chars`; continuation lines are indented by two spaces.
std::vector<std::string> wrap_text(const std::string& s, size_t max_chars) {
  std::vector<std::string> lines;
  std::istringstream words(s);
  std::string word, line;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > max_chars) {
      lines.push_back(line);
      line = "  ";
    }
    line += (line.empty() || line == "  " ? "" : " ") + word;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

void run_render(const LayoutArgs& a, const std::string& format, const std::string& out) {
  const ScaleLayout l = make_layout(a, parse_scale_format_or_throw(format, "--format"));
  check_output_path(out, "--out");
  // Lines wider than 64 cells wrap, so that every position up to max_cells is drawn.
  const int64_t width = std::min<int64_t>(std::max<int64_t>(buffer_line_width(l), 1), 64);
  const int64_t max_cells = 8192;
  const int64_t shown = std::min(l.size(), max_cells);
  const int64_t lines = (shown + width - 1) / std::max<int64_t>(width, 1);
  const auto cells = buffer_cells(l, shown);
  const int font = 10, title_font = 13, line_h = 14, ch = 18, margin = 20;
  // Cells fit their longest label ("row:kblock"); the offset column fits "offset" and the last offset.
  const std::string longest = std::to_string(std::max<int64_t>(l.rows - 1, 0)) + ":" +
                              std::to_string(std::max<int64_t>(l.kblocks() - 1, 0));
  const int64_t cw = std::max<int64_t>(44, text_px(longest, font) + 8);
  const int64_t offset_w = std::max(text_px("offset", font), text_px(std::to_string((lines - 1) * width), font)) + 12;
  const int64_t grid_w = offset_w + width * cw;
  // Text wraps at the grid's width, but never narrower than 100 characters.
  const int64_t text_w = std::max<int64_t>(grid_w, text_px(std::string(100, 'x'), font));
  const size_t max_chars = size_t(double(text_w) / (kGlyphEm * font));

  std::vector<std::string> text_lines = wrap_text(formula_text(l), max_chars);
  for (const std::string& s :
       {std::string("Each line holds ") + std::to_string(width) + " consecutive buffer positions; the offset column "
            "gives the position of the line's first cell, the +i header the position within the line.",
        std::string("A cell shows the data row and K-block (row:kblock) of the scale stored there; hue follows "
                    "the K-block, lightness alternates by row block.") +
            (shown < l.size() ? " Only the first " + std::to_string(shown) + " of " + std::to_string(l.size()) +
                                    " positions are drawn."
                              : std::string())}) {
    const auto w = wrap_text(s, max_chars);
    text_lines.insert(text_lines.end(), w.begin(), w.end());
  }
  const std::vector<std::string> title_lines =
      wrap_text(l.to_string(), size_t(double(text_w) / (kGlyphEm * title_font)));
  int64_t content_w = grid_w;
  for (const auto& t : title_lines) content_w = std::max(content_w, text_px(t, title_font));
  for (const auto& t : text_lines) content_w = std::max(content_w, text_px(t, font));

  std::ostringstream svg;
  int64_t y = margin;
  std::ostringstream head;
  for (const auto& t : title_lines) {
    y += 16;
    head << "<text x=\"" << margin << "\" y=\"" << y << "\" font-size=\"" << title_font << "\">" << xml_escape(t)
         << "</text>\n";
  }
  y += 4;
  for (const auto& t : text_lines) {
    y += line_h;
    head << "<text x=\"" << margin << "\" y=\"" << y << "\" xml:space=\"preserve\">" << xml_escape(t) << "</text>\n";
  }
  // Legend: padding, two row blocks of K-block 0, K-block 1.
  y += 10;
  head << "<g id=\"legend\">\n";
  int64_t x = margin;
  const std::pair<std::string, std::string> legend[] = {
      {"#dddddd", "zero padding"},
      {cell_colour(l, Cell{0, 0}), "K-block 0"},
      {cell_colour(l, Cell{std::max<int64_t>(l.block_rows() > 1 ? l.block_rows() : 32, 1), 0}),
       "K-block 0, next row block"},
      {cell_colour(l, Cell{0, 1}), "K-block 1"}};
  for (const auto& [colour, label] : legend) {
    head << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"14\" height=\"12\" fill=\"" << colour << "\"/>"
         << "<text x=\"" << x + 18 << "\" y=\"" << y + 10 << "\">" << label << "</text>\n";
    x += 18 + text_px(label, font) + 16;
  }
  content_w = std::max(content_w, x - margin);
  head << "</g>\n";
  y += 12 + 10;
  // Column header: "offset" over the offset column, +i over each cell column.
  y += line_h;
  head << "<text x=\"" << margin << "\" y=\"" << y << "\" font-weight=\"bold\">offset</text>\n";
  for (int64_t i = 0; i < width; ++i)
    head << "<text x=\"" << margin + offset_w + i * cw + 3 << "\" y=\"" << y << "\" fill=\"#666666\">+" << i
         << "</text>\n";
  const int64_t top = y + 6;
  const int64_t w = margin * 2 + content_w;
  const int64_t h = top + lines * ch + margin;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h << "\" viewBox=\"0 0 " << w
      << ' ' << h << "\" font-family=\"DejaVu Sans Mono, monospace\" font-size=\"" << font << "\">\n"
      << "<title>" << xml_escape(l.to_string()) << "</title>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\" class=\"background\"/>\n"
      << head.str();
  for (int64_t line = 0; line < lines; ++line) {
    const int64_t ly = top + line * ch;
    svg << "<text x=\"" << margin << "\" y=\"" << ly + 13 << "\">" << line * width << "</text>\n";
    for (int64_t i = 0; i < width; ++i) {
      const int64_t pos = line * width + i;
      if (pos >= shown) break;
      const Cell& c = cells[static_cast<size_t>(pos)];
      const int64_t cx = margin + offset_w + i * cw;
      svg << "<rect class=\"cell\" x=\"" << cx << "\" y=\"" << ly << "\" width=\"" << cw - 2 << "\" height=\""
          << ch - 2 << "\" fill=\"" << cell_colour(l, c) << "\"><title>offset " << pos;
      if (c.row >= 0) svg << ": row " << c.row << ", K-block " << c.kb;
      else svg << ": padding";
      svg << "</title></rect>\n";
      if (c.row >= 0)
        svg << "<text x=\"" << cx + 3 << "\" y=\"" << ly + 12 << "\">" << c.row << ':' << c.kb << "</text>\n";
    }
  }
  svg << "</svg>\n";
  write_rendered(out, svg.str());
  std::printf("wrote %s: %lld of %lld buffer positions\n", out.c_str(), static_cast<long long>(shown),
              static_cast<long long>(l.size()));
}

// The scale buffers of an m-grouped A as one picture: each group's own buffer in group order, under a
// caption with its rows and byte range; cells show the operand's (global) row and the K-block.
void run_render_grouped(const LayoutArgs& a, const std::string& sizes_text, const std::string& format,
                        const std::string& out) {
  check_output_path(out, "--out", {sizes_text});
  const std::vector<int64_t> sizes = parse_group_sizes(sizes_text);
  GroupedGemmArgs g;
  g.groups = int64_t(sizes.size());
  g.group_sizes = sizes.data();
  g.k = a.cols;
  g.a.recipe = parse_recipe_or_throw(a.recipe, "--recipe");
  g.a.scale_format = parse_scale_format_or_throw(format, "--format");
  check_group_rows(sizes, a.rows);
  const std::vector<int64_t> offs = grouped_scale_offsets(g);
  const int font = 10, title_font = 13, line_h = 14, ch = 18, margin = 20, width = 32;
  const int64_t cw = std::max<int64_t>(44, text_px(std::to_string(std::max<int64_t>(a.rows - 1, 0)) + ":" +
                                                        std::to_string(layouts::ceil_div(a.cols, 16)), font) + 8);
  const int64_t offset_w = text_px("offset 000000", font);
  const int64_t grid_w = offset_w + width * cw;
  const int64_t max_cells = 4096;  // per group
  // And in all: 10^6 one-row groups once made a 908 MB picture. Groups past the caps are summed up.
  const int64_t max_total_cells = 8192, max_groups = 256;
  int64_t drawn = 0;
  std::ostringstream body;
  int64_t y = margin;
  const std::string title = std::string(to_string(g.a.recipe)) + " scales of an m-grouped A: " + std::to_string(a.rows) +
                            " rows in " + std::to_string(sizes.size()) + " groups, K=" + std::to_string(a.cols) + ", " +
                            format + " format";
  y += 16;
  body << "<text x=\"" << margin << "\" y=\"" << y << "\" font-size=\"" << title_font << "\">" << xml_escape(title)
       << "</text>\n";
  const std::string note = "Each group's own buffer, in group order" +
                           std::string(g.a.scale_format == ScaleFormat::kCublasLt ? ", each starting on a 16-byte boundary"
                                                                                    : "") +
                           "; a cell shows the operand row and K-block (row:kblock), grey = zero padding; the offset "
                           "column gives the element position in the whole buffer.";
  for (const auto& t : wrap_text(note, size_t(double(grid_w) / (kGlyphEm * font)))) {
    y += line_h;
    body << "<text x=\"" << margin << "\" y=\"" << y << "\" xml:space=\"preserve\">" << xml_escape(t) << "</text>\n";
  }
  y += line_h + 4;
  body << "<text x=\"" << margin << "\" y=\"" << y << "\" font-weight=\"bold\">offset</text>\n";
  for (int64_t i = 0; i < width; ++i)
    body << "<text x=\"" << margin + offset_w + i * cw + 3 << "\" y=\"" << y << "\" fill=\"#666666\">+" << i
         << "</text>\n";
  int64_t r0 = 0;
  const int64_t elem_bytes = layouts::ScaleLayout(g.a.recipe, 1, a.cols, g.a.scale_format).scale_bytes();
  for (size_t gi = 0; gi < sizes.size(); ++gi) {
    if (int64_t(gi) >= max_groups || drawn >= max_total_cells) {
      y += 22;
      body << "<text x=\"" << margin << "\" y=\"" << y << "\" class=\"more-groups\">... groups " << gi << " to "
           << sizes.size() - 1 << " (rows [" << r0 << ", " << a.rows << "), bytes [" << offs[gi] << ", " << offs.back()
           << ")) not drawn: a picture shows at most " << max_groups << " groups and " << max_total_cells
           << " positions</text>\n";
      break;
    }
    const ScaleLayout l(g.a.recipe, sizes[gi], a.cols, g.a.scale_format);
    y += 22;
    body << "<text x=\"" << margin << "\" y=\"" << y << "\" font-weight=\"bold\" class=\"group\">group " << gi
         << ": rows [" << r0 << ", " << r0 + sizes[gi] << "), bytes [" << offs[gi] << ", " << offs[gi] + l.bytes()
         << ")" << (l.size() == 0 ? " (empty)" : "") << "</text>\n";
    const int64_t shown = std::min({l.size(), max_cells, max_total_cells - drawn});
    drawn += shown;
    const auto cells = buffer_cells(l, shown);
    const int64_t base = offs[gi] / elem_bytes;
    const int64_t lines = (shown + width - 1) / width;
    y += 6;
    for (int64_t line = 0; line < lines; ++line) {
      const int64_t ly = y + line * ch;
      body << "<text x=\"" << margin << "\" y=\"" << ly + 13 << "\">" << base + line * width << "</text>\n";
      for (int64_t i = 0; i < width && line * width + i < shown; ++i) {
        Cell c = cells[size_t(line * width + i)];
        const int64_t cx = margin + offset_w + i * cw;
        const std::string colour = cell_colour(l, c);
        if (c.row >= 0) c.row += r0;
        body << "<rect class=\"cell\" x=\"" << cx << "\" y=\"" << ly << "\" width=\"" << cw - 2 << "\" height=\""
             << ch - 2 << "\" fill=\"" << colour << "\"/>\n";
        if (c.row >= 0)
          body << "<text x=\"" << cx + 3 << "\" y=\"" << ly + 12 << "\">" << c.row << ':' << c.kb << "</text>\n";
      }
    }
    y += lines * ch;
    if (shown < l.size()) {
      y += line_h;
      body << "<text x=\"" << margin << "\" y=\"" << y << "\">... " << l.size() - shown << " more positions</text>\n";
    }
    r0 += sizes[gi];
  }
  const int64_t w = margin * 2 + std::max(grid_w, text_px(title, title_font));
  const int64_t h = y + margin;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h << "\" viewBox=\"0 0 " << w
      << ' ' << h << "\" font-family=\"DejaVu Sans Mono, monospace\" font-size=\"" << font << "\">\n"
      << "<title>" << xml_escape(title) << "</title>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\" class=\"background\"/>\n"
      << body.str() << "</svg>\n";
  write_rendered(out, svg.str());
  std::printf("wrote %s: %zu groups, %lld bytes of scales\n", out.c_str(), sizes.size(),
              static_cast<long long>(offs.back()));
}

void run_check(const LayoutArgs& a, const std::string& format, const std::string& path, bool json) {
  const ScaleLayout l = make_layout(a, parse_scale_format_or_throw(format, "--format"));
  const io::NpyArray arr = read_npy_option(path, "--scales");
  const LoadedScales loaded = load_scales(arr, l, "scales", true, path);
  const bool ok = loaded.diagnostics.empty();
  if (json) {
    nlohmann::json j;
    j["valid"] = ok;
    j["file"] = path;
    j["array"] = arr.describe();
    j["layout"] = l.to_string();
    j["diagnostics"] = diagnostics_json(loaded.diagnostics);
    std::cout << j.dump(2) << '\n';
  } else if (ok) {
    std::printf("valid: %s (%s) is %s\n", path.c_str(), arr.describe().c_str(), l.to_string().c_str());
  } else {
    std::printf("invalid: %s (%s) as %s: %zu problem(s)\n", path.c_str(), arr.describe().c_str(),
                l.to_string().c_str(), loaded.diagnostics.size());
    std::fflush(stdout);
    print_diagnostics(stdout, loaded.diagnostics);
  }
  std::fflush(stdout);
  if (!ok) throw Exit{kExitInvalidInput};
}

void run_convert(const LayoutArgs& a, const std::string& from, const std::string& to, const std::string& in,
                 const std::string& out) {
  const ScaleLayout src = make_layout(a, parse_scale_format_or_throw(from, "--from"));
  const ScaleLayout dst = src.with_format(parse_scale_format_or_throw(to, "--to"));
  check_output_path(out, "--out", {in});
  const io::NpyArray arr = read_npy_option(in, "--in");
  const LoadedScales loaded = load_scales(arr, src, "in", true, in);
  if (!loaded.diagnostics.empty()) {
    std::fprintf(stderr, "scalemm: %s (%s) is not a valid %s; nothing written\n", in.c_str(),
                 arr.describe().c_str(), src.to_string().c_str());
    print_diagnostics(stderr, loaded.diagnostics);
    throw Exit{kExitInvalidInput};
  }
  io::NpyArray result;
  result.descr = dst.scale_bytes() == 4 ? "<f4" : "|u1";
  if (dst.format == ScaleFormat::kCompact) result.shape = {dst.padded_rows(), dst.padded_kblocks()};
  else result.shape = {dst.size()};
  result.data.assign(size_t(dst.bytes()), 0);
  layouts::convert(src, loaded.buffer.data(), dst, result.data.data());
  io::write_npy(out, result, "--out");
  std::printf("wrote %s: %s, %s\n", out.c_str(), result.describe().c_str(), dst.to_string().c_str());
}

}  // namespace

void register_layout_commands(CLI::App& app) {
  auto* layout = app.add_subcommand("layout", "Explain, check, convert and render scale layouts");
  layout->require_subcommand(1);

  static LayoutArgs explain_args;
  static bool explain_json = false;
  auto* explain = layout->add_subcommand("explain", "Compact and cuBLASLt layouts of one operand's scales");
  add_layout_args(explain, explain_args);
  explain->add_flag("--json", explain_json, "Print the description as JSON");
  static std::string explain_groups, explain_format = "compact";
  explain->add_option("--group-sizes", explain_groups,
                      "Rows of each group of an m-grouped operand (\"3,0,5\" or a .npy): print each group's scale "
                      "buffer (docs/grouped.md)");
  explain->add_option("--format", explain_format, "With --group-sizes: compact|cublaslt (default compact)")
      ->check(CLI::IsMember({"compact", "cublaslt"}));
  explain->callback([] {
    if (!explain_groups.empty()) run_explain_grouped(explain_args, explain_groups, explain_format, explain_json);
    else run_explain(explain_args, explain_json);
  });

  static LayoutArgs render_args;
  static std::string render_format = "cublaslt";
  static std::string render_out;
  auto* render = layout->add_subcommand("render", "Draw where each logical scale lands, as SVG");
  add_layout_args(render, render_args);
  render->add_option("--format", render_format, "compact|cublaslt (default cublaslt)")
      ->check(CLI::IsMember({"compact", "cublaslt"}));
  render->add_option("--out", render_out, "Output .svg path")->required();
  static std::string render_groups;
  render->add_option("--group-sizes", render_groups,
                     "Rows of each group of an m-grouped operand (\"3,0,5\" or a .npy): draw each group's scale "
                     "buffer (docs/grouped.md)");
  render->callback([] {
    if (!render_groups.empty()) run_render_grouped(render_args, render_groups, render_format, render_out);
    else run_render(render_args, render_format, render_out);
  });

  static LayoutArgs check_args;
  static std::string check_format, check_scales;
  static bool check_json = false;
  auto* check = layout->add_subcommand(
      "check", "Check a .npy scale buffer against its layout contract: exit 0 valid, 1 with each diagnostic");
  add_layout_args(check, check_args);
  check->add_option("--format", check_format, "Format the buffer claims: compact|cublaslt")
      ->required()
      ->check(CLI::IsMember({"compact", "cublaslt"}));
  check->add_option("--scales", check_scales, "Scale buffer (.npy: float32, or uint8 raw E8M0/UE4M3 bits)")
      ->required();
  check->add_flag("--json", check_json, "Print the verdict and diagnostics as JSON");
  check->callback([] { run_check(check_args, check_format, check_scales, check_json); });

  static LayoutArgs convert_args;
  static std::string convert_from, convert_to, convert_in, convert_out;
  auto* convert = layout->add_subcommand(
      "convert", "Convert a .npy scale buffer between compact (2-D grid) and cublaslt (flat, padded) formats");
  add_layout_args(convert, convert_args);
  convert->add_option("--from", convert_from, "Format of the input: compact|cublaslt")
      ->required()
      ->check(CLI::IsMember({"compact", "cublaslt"}));
  convert->add_option("--to", convert_to, "Format of the output: compact|cublaslt")
      ->required()
      ->check(CLI::IsMember({"compact", "cublaslt"}));
  convert->add_option("--in", convert_in, "Input .npy")->required();
  convert->add_option("--out", convert_out, "Output .npy (written only when the input is valid)")->required();
  convert->callback([] { run_convert(convert_args, convert_from, convert_to, convert_in, convert_out); });

}

}  // namespace scalemm::cli
