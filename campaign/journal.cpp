#include "campaign/journal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <filesystem>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace ulpgate {
namespace {

using json = nlohmann::json;

std::string errno_text() { return std::strerror(errno); }

std::string dump(const json& j) {
  // Kernel messages and notes need not be UTF-8; a journal line must always be writable.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json header_json(const json& campaign) { return {{"ulpgate_journal", kJournalVersion}, {"campaign", campaign}}; }

// The file's text as read through fd (from offset 0).
std::string read_all(int fd, const std::string& path) {
  std::string text;
  char chunk[1 << 16];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, chunk, sizeof chunk, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(fmt::format("{}: cannot read ({})", path, errno_text()));
    if (n == 0) return text;
    text.append(chunk, static_cast<std::size_t>(n));
    at += n;
  }
}

// A line's JSON, or an InputError naming file and line (with the limits of every JSON
// reader: nesting depth, numbers beyond double).
json parse_line(const std::string& text, const std::string& path, std::size_t line_no) {
  if (text.empty()) throw InputError(fmt::format("{}:{}: empty line in a journal", path, line_no));
  try {
    return parse_json(text);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}:{}: {}", path, line_no, e.what()));
  }
}

const json kFinishedLine = {{"finished", true}};
bool is_finished_line(const json& j) { return j == kFinishedLine; }

JournalEntry entry_from_json(const json& j, const std::string& path, std::size_t line_no) {
  const std::string where = fmt::format("{}:{}", path, line_no);
  try {
    if (!j.is_object()) throw InputError("must be a JSON object");
    for (const auto& [k, v] : j.items())
      if (k != "kernel" && k != "case" && k != "result") throw InputError(k + ": unknown field");
    if (!j.contains("kernel") || !j["kernel"].is_string()) throw InputError("kernel: missing or not a string");
    if (!j.contains("case")) throw InputError("case: missing");
    if (!j.contains("result")) throw InputError("result: missing");
    JournalEntry e;
    e.kernel = j["kernel"].get<std::string>();
    e.requested = case_from_json(j["case"]);
    e.result = case_result_from_json(j["result"], "result");
    return e;
  } catch (const InputError& e) {
    throw InputError(where + ": " + e.what());
  }
}

// A parsed journal file. `kept` is the length of the prefix made of whole lines (what stays
// when a truncated last line is dropped); a file without a whole header line has no
// campaign (`header` false) and counts as empty.
struct Parsed {
  bool header = false;
  json campaign;
  std::vector<JournalEntry> entries;
  std::size_t kept = 0;
  std::size_t truncated_bytes = 0;
  /// The last whole line marks the campaign finished; it starts at finished_at.
  bool finished = false;
  std::size_t finished_at = 0;
};

Parsed parse_journal(const std::string& text, const std::string& path) {
  Parsed p;
  std::size_t line_no = 0, start = 0;
  for (std::size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    ++line_no;
    const json j = parse_line(text.substr(start, nl - start), path, line_no);
    if (line_no == 1) {
      if (!j.is_object() || !j.contains("ulpgate_journal"))
        throw InputError(fmt::format("{}:1: not an ulpgate journal (no \"ulpgate_journal\" header)", path));
      const json& v = j["ulpgate_journal"];
      if (!v.is_number_integer() || v.get<std::int64_t>() != kJournalVersion)
        throw InputError(fmt::format("{}:1: unsupported journal version {} (this build reads {})", path, v.dump(),
                                     kJournalVersion));
      p.header = true;
      p.campaign = j.value("campaign", json(nullptr));
    } else if (is_finished_line(j)) {
      p.finished = true;
      p.finished_at = start;
    } else {
      p.entries.push_back(entry_from_json(j, path, line_no));
      p.finished = false;  // a line after the mark: the campaign went on
    }
    p.kept = nl + 1;
  }
  // Every line is written with its newline in one write() call: bytes after the last
  // newline are the part of a line that an interrupted write left behind.
  p.truncated_bytes = text.size() - p.kept;
  return p;
}

// The case lines of a journal whose campaign did not finish: whole lines after a journal
// header, unless the last whole line is the finished mark. Entries are not parsed: a
// damaged journal still holds results worth a --resume (which then says what is wrong).
std::size_t count_unfinished(const std::string& text) {
  std::size_t cases = 0, line_no = 0;
  bool finished = false;
  for (std::size_t start = 0, nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string_view line(text.data() + start, nl - start);
    if (++line_no == 1) {
      if (line.find("\"ulpgate_journal\"") == std::string_view::npos) return 0;  // not a journal
      continue;
    }
    finished = line == std::string_view(R"({"finished":true})");
    if (!finished) ++cases;
  }
  return finished ? 0 : cases;
}

}  // namespace

std::string Journal::key(const std::string& kernel, const Case& requested) {
  // nlohmann objects are ordered maps, so the dump is canonical: equal cases, equal keys.
  return kernel + '\n' + to_json(requested).dump();
}

Journal::Journal(std::string path, const json& campaign, bool resume, bool sync) : path_(std::move(path)), sync_(sync) {
  // Not O_TRUNC: the lock must be held before anything in the file is touched.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw InputError(fmt::format("{}: cannot open the journal ({})", path_, errno_text()));
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw InputError(fmt::format("{}: not a regular file", path_));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string why = errno == EWOULDBLOCK ? "in use by another ulpgate process" : errno_text();
    ::close(fd_);
    throw InputError(fmt::format("{}: cannot lock the journal ({})", path_, why));
  }
  try {
    Parsed parsed;
    if (!resume) {
      // Not O_TRUNC above, and read under the lock: results an interrupted campaign
      // journaled are never replaced without being asked.
      if (const std::size_t n = count_unfinished(read_all(fd_, path_)))
        throw InputError(fmt::format("{} holds an unfinished campaign ({} cases journaled): --resume continues it, "
                                     "or remove it / choose another --out",
                                     path_, n));
    }
    if (resume) {
      parsed = parse_journal(read_all(fd_, path_), path_);
      if (parsed.header && parsed.campaign != campaign)
        throw InputError(fmt::format("{}: journal of another campaign ({}); resume needs the same campaign "
                                     "(remove the file to start over)",
                                     path_, dump(parsed.campaign)));
      if (parsed.truncated_bytes)
        notes_.push_back(fmt::format("{}: ignored a truncated last line ({} bytes; the write was interrupted)",
                                     path_, parsed.truncated_bytes));
      if (!parsed.header) notes_.push_back(fmt::format("{}: no earlier results; starting a new journal", path_));
    }
    if (parsed.header) {
      if (parsed.truncated_bytes && ::ftruncate(fd_, static_cast<off_t>(parsed.kept)) != 0)
        throw InputError(fmt::format("{}: cannot drop the truncated last line ({})", path_, errno_text()));
      // Resumed, the campaign is unfinished again until it marks the journal once more.
      if (parsed.finished && ::ftruncate(fd_, static_cast<off_t>(parsed.finished_at)) != 0)
        throw InputError(fmt::format("{}: cannot reopen the finished journal ({})", path_, errno_text()));
      add_loaded(std::move(parsed.entries));
    } else {
      if (::ftruncate(fd_, 0) != 0) throw InputError(fmt::format("{}: cannot truncate ({})", path_, errno_text()));
      write_line(dump(header_json(campaign)) + "\n");
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

Journal::~Journal() {
  if (fd_ < 0) return;
  if (sync_ && unsynced_) ::fsync(fd_);
  ::close(fd_);  // releases the lock
}

void Journal::write_line(const std::string& line) {
  // One write() per line (retried only after a short write): a reader sees whole lines,
  // and an interruption leaves at most one partial last line, which a resume drops.
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(fmt::format("{}: cannot append to the journal ({})", path_, errno_text()));
    done += static_cast<std::size_t>(n);
  }
  // Written lines survive the process (a crash, SIGKILL) at once; against the machine
  // failing, fsync at most every kSyncSeconds (one per line would cap a campaign near a
  // few thousand cases/s) and when the journal closes.
  unsynced_ = true;
  if (sync_ && std::chrono::steady_clock::now() - last_sync_ >= std::chrono::duration<double>(kSyncSeconds)) sync_now();
}

void Journal::sync_now() {
  if (!unsynced_) return;
  if (::fsync(fd_) != 0) throw InputError(fmt::format("{}: cannot sync the journal ({})", path_, errno_text()));
  unsynced_ = false;
  last_sync_ = std::chrono::steady_clock::now();
}

void Journal::absorb(const std::string& other, const json& campaign) {
  std::error_code ec;
  if (!std::filesystem::exists(other, ec)) return;
  JournalContents c = read_journal(other);
  if (c.campaign != campaign)
    throw InputError(fmt::format("{}: journal of another campaign ({}); resume needs the same campaign "
                                 "(remove the file to start over)",
                                 other, dump(c.campaign)));
  add_loaded(std::move(c.entries));
}

void Journal::add_loaded(std::vector<JournalEntry> entries) {
  for (JournalEntry& e : entries) {
    by_key_[key(e.kernel, e.requested)].push_back(entries_.size());
    entries_.push_back(std::move(e));
    ++loaded_;
  }
}

const CaseResult* Journal::find(const std::string& kernel, const Case& requested) const {
  const std::string k = key(kernel, requested);
  const auto it = by_key_.find(k);
  if (it == by_key_.end()) return nullptr;
  const auto t = taken_.find(k);
  const std::size_t next = t == taken_.end() ? 0 : t->second;
  return next < it->second.size() ? &entries_[it->second[next]].result : nullptr;
}

std::optional<CaseResult> Journal::take(const std::string& kernel, const Case& requested) {
  const std::string k = key(kernel, requested);
  const auto it = by_key_.find(k);
  if (it == by_key_.end()) return std::nullopt;
  std::size_t& next = taken_[k];
  if (next >= it->second.size()) return std::nullopt;
  const std::size_t index = it->second[next++];
  visited_.push_back(index);
  ++reused_;
  return entries_[index].result;
}

void Journal::append(const std::string& kernel, const Case& requested, const CaseResult& result,
                     std::string_view case_json, std::string_view result_json) {
  // The same line dump() gives the object {"case", "kernel", "result"} (keys sorted).
  std::string line = "{\"case\":";
  line += case_json.empty() ? dump(to_json(requested)) : std::string(case_json);
  line += ",\"kernel\":" + dump(json(kernel)) + ",\"result\":";
  line += result_json.empty() ? dump(case_result_to_json(result)) : std::string(result_json);
  line += "}\n";
  write_line(line);
  const std::size_t index = entries_.size();
  entries_.push_back({kernel, requested, result});
  // Visited at once: it goes among this key's visited entries, before any loaded ones
  // not taken yet, so find() keeps returning those in order.
  const std::string k = key(kernel, requested);
  auto& indices = by_key_[k];
  std::size_t& next = taken_[k];
  indices.insert(indices.begin() + static_cast<std::ptrdiff_t>(next), index);
  ++next;
  visited_.push_back(index);
}

CaseResult Journal::resume_or_run(const std::string& kernel, const Case& requested,
                                  const std::function<CaseResult()>& evaluate) {
  if (auto done = take(kernel, requested)) return *std::move(done);
  CaseResult r = evaluate();
  append(kernel, requested, r);
  return r;
}

std::vector<CaseResult> Journal::campaign_cases() const {
  std::vector<CaseResult> out;
  out.reserve(visited_.size());
  for (std::size_t i : visited_) out.push_back(entries_[i].result);
  return out;
}

JournalContents read_journal(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open the journal ({})", path, errno_text()));
  std::string text;
  try {
    text = read_all(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  Parsed p = parse_journal(text, path);
  if (!p.header) throw InputError(fmt::format("{}: empty journal (no header line)", path));
  return {std::move(p.campaign), std::move(p.entries), p.truncated_bytes > 0, p.finished};
}

void mark_journal_finished(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open the journal ({})", path, errno_text()));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0)
    throw InputError(fmt::format("{}: cannot lock the journal ({})", path,
                                 errno == EWOULDBLOCK ? "in use by another ulpgate process" : errno_text()));
  if (!count_unfinished(read_all(fd, path))) return;  // finished already, or nothing to keep
  const std::string line = dump(kFinishedLine) + "\n";
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(fmt::format("{}: cannot append to the journal ({})", path, errno_text()));
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) throw InputError(fmt::format("{}: cannot sync the journal ({})", path, errno_text()));
}

std::size_t unfinished_journal_cases(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::string text;
  try {
    text = read_all(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return count_unfinished(text);
}

}  // namespace ulpgate
