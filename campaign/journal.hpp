// The campaign journal: every evaluated case is appended to a JSONL file as soon as it is
// known, each line in one write, so that a crash, Ctrl-C or SIGKILL of the campaign loses
// nothing and an interrupted campaign resumes where it stopped.
// File format and resume rules: see docs/concepts/isolation.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "campaign/record.hpp"

namespace ulpgate {

inline constexpr int kJournalVersion = 1;
/// The least time between two fsyncs of a journal (Journal::append).
inline constexpr double kSyncSeconds = 0.25;

/// One journaled evaluation.
struct JournalEntry {
  std::string kernel;
  Case requested;      ///< the case as the campaign generated it (the lookup key)
  CaseResult result;
};

/// An open journal. Holds an exclusive lock on the file (flock) while open, so two
/// campaigns cannot interleave lines in one journal. Not thread-safe.
class Journal {
 public:
  /// Opens path for appending. resume = false starts a new journal: an existing file is
  /// replaced, unless it holds an unfinished campaign (unfinished_journal_cases() > 0),
  /// which is an InputError ("--resume continues it"). resume = true loads the entries an earlier run of the same campaign wrote:
  /// a missing or empty file starts a new journal; a truncated last line (the write a
  /// SIGKILL interrupted) is dropped from the file, with a note; a damaged line before it,
  /// or a journal of another campaign, is an InputError naming the file and line.
  /// sync = false skips the fsyncs (tests; data still reaches the kernel).
  Journal(std::string path, const nlohmann::json& campaign, bool resume, bool sync = true);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  /// The result an earlier run recorded for the next occurrence of (kernel, requested case)
  /// in this run, or nullptr. A campaign that evaluates the same case twice finds the
  /// earlier run's first entry, then its second. Does not count the case as visited.
  const CaseResult* find(const std::string& kernel, const Case& requested) const;

  /// Adds the entries of another journal of the same campaign (another process's part of
  /// a shared campaign) to those find() and take() know, read-only: nothing is written
  /// here or there. A missing file adds nothing; one of another campaign is an InputError.
  void absorb(const std::string& other, const nlohmann::json& campaign);

  /// find(), counting the case as visited in this run when found.
  std::optional<CaseResult> take(const std::string& kernel, const Case& requested);

  /// Appends one evaluation (one line, written in one call) and
  /// counts it as visited. Throws InputError when the file cannot be written. The line is
  /// fsync'd when it is the first written kSyncSeconds or more after the last fsync (and on
  /// close), so a lost node loses at most the lines since. case_json and
  /// result_json, when not empty, are requested's and result's JSON text already made (the
  /// worker's reply, dumped off the campaign thread), written as they are.
  void append(const std::string& kernel, const Case& requested, const CaseResult& result,
              std::string_view case_json = {}, std::string_view result_json = {});

  /// take(), or else evaluate() and append its result: the one call a campaign loop needs.
  /// In the campaign's deterministic order, for each (kernel, case):
  ///   journal.resume_or_run(kernel, case, [&] { return evaluator.evaluate(kernel, case, options); });
  /// then record.cases = journal.campaign_cases().
  CaseResult resume_or_run(const std::string& kernel, const Case& requested,
                           const std::function<CaseResult()>& evaluate);

  /// The final run-record cases: the results visited in this run (taken or appended), in
  /// the order the campaign visited them; equal to an uninterrupted run's, timings included
  /// for the cases evaluated before the interruption.
  std::vector<CaseResult> campaign_cases() const;

  /// Every entry of the file, in file order (what an interrupted campaign has so far).
  const std::vector<JournalEntry>& entries() const { return entries_; }
  /// Entries found in the file when it was opened.
  std::size_t loaded() const { return loaded_; }
  /// Loaded entries this run has taken so far.
  std::size_t reused() const { return reused_; }
  /// Things worth telling the user about the file (a dropped truncated line, a new journal
  /// where a resume was asked for), one line each.
  const std::vector<std::string>& notes() const { return notes_; }
  const std::string& path() const { return path_; }

 private:
  static std::string key(const std::string& kernel, const Case& requested);
  /// Earlier results (this file's or another's), found by find() and take().
  void add_loaded(std::vector<JournalEntry> entries);
  void write_line(const std::string& line);
  void sync_now();

  std::string path_;
  bool sync_;
  bool unsynced_ = false;
  std::chrono::steady_clock::time_point last_sync_{};
  int fd_ = -1;
  std::vector<JournalEntry> entries_;
  /// Entry indices per key in file order, and how many of them this run has taken.
  std::map<std::string, std::vector<std::size_t>> by_key_;
  std::map<std::string, std::size_t> taken_;
  std::vector<std::size_t> visited_;  ///< entry indices in campaign order
  std::size_t loaded_ = 0, reused_ = 0;
  std::vector<std::string> notes_;
};

/// Marks the campaign of the journal at path finished (its record is written), so that a
/// new campaign may replace it: appends the line {"finished": true}. A resume drops the
/// mark again until the resumed campaign finishes. Throws InputError naming the file.
void mark_journal_finished(const std::string& path);

/// How many cases the journal at path holds for a campaign that did not finish (0: no
/// file, no case journaled, or finished); what a new campaign must not silently replace.
/// Reads the file's lines without parsing the entries.
std::size_t unfinished_journal_cases(const std::string& path);

/// Reads a journal without opening it for writing (a report on an interrupted campaign):
/// its campaign and entries in file order; a truncated last line is skipped, a damaged one
/// before it is an InputError naming the file and line.
struct JournalContents {
  nlohmann::json campaign;
  std::vector<JournalEntry> entries;
  bool truncated_tail = false;
  bool finished = false;  ///< the last line marks the campaign finished
};
JournalContents read_journal(const std::string& path);

}  // namespace ulpgate
