// Huge-page buffers: aligned, zeroed, fully usable, and advising rejects regions without a whole page.
#include <QtTest>
#include "common/test_suite.h"

#include <cstdint>
#include <cstring>

#include "engine/kernels/huge_pages.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_huge_pages {

using namespace kvchat::kernels;

class HugePagesTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void buffer_is_aligned_zeroed_and_writable() {
    for (std::size_t bytes : {std::size_t{1}, std::size_t{4096}, (std::size_t{2} << 20) + 1, std::size_t{9} << 20}) {
      auto* buffer = static_cast<unsigned char*>(allocate_huge_page_buffer(bytes));
      QVERIFY(buffer != nullptr);
      QCOMPARE(reinterpret_cast<std::uintptr_t>(buffer) % (std::uintptr_t{2} << 20), std::uintptr_t{0});
      for (std::size_t i = 0; i < bytes; ++i) {
        if (buffer[i] != 0) QFAIL(qPrintable(QString("byte %1 of %2 not zero").arg(i).arg(bytes)));
      }
      for (std::size_t i = 0; i < bytes; ++i) buffer[i] = static_cast<unsigned char>(i * 31u);
      for (std::size_t i = 0; i < bytes; ++i) {
        if (buffer[i] != static_cast<unsigned char>(i * 31u)) QFAIL(qPrintable(QString("byte %1 lost").arg(i)));
      }
      free_huge_page_buffer(buffer, bytes);
    }
    free_huge_page_buffer(nullptr, 0);  // no-op
  }

  void advising_needs_a_whole_huge_page() {
    const std::size_t bytes = std::size_t{4} << 20;
    auto* buffer = static_cast<unsigned char*>(allocate_huge_page_buffer(bytes));
    QVERIFY(!advise_huge_pages(buffer + 4096, std::size_t{1} << 20));  // no 2 MiB page inside
    QVERIFY(!advise_huge_pages(buffer, 0));
#if defined(__linux__)
    QFile thp("/sys/kernel/mm/transparent_hugepage/enabled");
    if (thp.open(QIODevice::ReadOnly) && !thp.readAll().contains("[never]")) {
      QVERIFY(advise_huge_pages(buffer + 1, bytes - 1));  // the second page is whole
    }
#endif
    free_huge_page_buffer(buffer, bytes);
  }
};

KVCHAT_TEST_APPLESS_MAIN(HugePagesTest)

}  // namespace kernels_test_huge_pages

#include "test_huge_pages.moc"
