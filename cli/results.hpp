// What verbs print and write of what they found: one case's analysis (replay, check) and a
// campaign's record and reports (fuzz, merge).
#pragma once

#include <filesystem>
#include <string>

#include "campaign/record.hpp"
#include "cli/exit.hpp"

namespace ulpgate {

/// Prints r's analysis and writes it as a run record of `kind` ("replay", "check") where
/// out_json is given; Exit::Failed when its verdict failed.
Exit finish_single_case(CaseResult& r, const std::string& kind, const std::string& command, const std::string& out_json);

/// Writes the campaign's record (out/fuzz.json) and reports and prints its summary;
/// Exit::Failed when a case failed or, unless allow_partial, when planned cases did not run.
Exit write_campaign_outputs(const RunRecord& r, const std::filesystem::path& out, bool no_html, bool allow_partial);

}  // namespace ulpgate
