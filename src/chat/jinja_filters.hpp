// The Jinja engine's filter table, shared by the files that fill it: jinja_filters.cpp gathers
// every family into one table by name (filters()), jinja_filters_seq.cpp defines the families
// that work on a sequence's or a dict's items. Internal to src/chat.
//
//   FilterTable table;
//   add_order_filters(table);  // max, min, sort, unique
#pragma once

#include <map>
#include <string>

#include "chat/jinja_eval.hpp"

namespace rlx::chat::jinja::detail {

using FilterFn = Value (*)(Renderer&, const Value&, Arguments&);
using FilterTable = std::map<std::string, FilterFn, std::less<>>;

// ---- families of filters on items (jinja_filters_seq.cpp)
void add_sequence_filters(FilterTable& table);  // first, last, length, list, reverse
void add_order_filters(FilterTable& table);     // max, min, sort, unique
void add_per_item_filters(FilterTable& table);  // join, map, select/reject(attr), sum
void add_mapping_filters(FilterTable& table);   // attr, dictsort, items

}  // namespace rlx::chat::jinja::detail
